//! The per-Model series of the controller's `/metrics`, held apart from the process's
//! Prometheus exporter so that a Model's series can be removed.
//!
//! The exporter keeps every series it was given for the life of the process, and the
//! `metrics` facade has no call that removes one: a deleted Model would report its last
//! backlog, desired replicas, panic state and fleet cost for as long as the controller runs.
//! The reconciler therefore records what it labels `model` (the autoscaler's telemetry, the
//! fleet cost) into this registry ([`ModelMetrics::record`]), which drops a Model's series
//! when its finaliser has run or the Model is found gone ([`ModelMetrics::forget`]) and all
//! of them when the controller stops leading ([`ModelMetrics::clear`]); `/metrics` renders
//! them after the exporter's text ([`ModelMetrics::appended_to`]). The exporter's idle
//! timeout would drop them too, but only after a delay long enough to spare a live Model's
//! series, during which dashboards still show the deleted one.
//!
//! Counters and gauges only: the reconciler records no per-Model histogram.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

use crate::http::Render;

/// The label that names a series' Model (`namespace/name`).
pub const MODEL: &str = "model";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// A series: its name and its labels in the order they were given.
type SeriesKey = (String, Vec<(String, String)>);

/// A series' kind and value (a counter's count, or a gauge's `f64` bits).
type Series = (Kind, Arc<AtomicU64>);

/// Counters and gauges labelled by Model, removable per Model.
#[derive(Debug, Default)]
pub struct ModelMetrics {
    series: Mutex<BTreeMap<SeriesKey, Series>>,
}

impl ModelMetrics {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` with this registry as the thread's `metrics` recorder: what it records (with
    /// the `metrics` macros, synchronously) lands here and not in the exporter.
    pub fn record<T>(&self, f: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(self, f)
    }

    /// Removes every series labelled `model="{model}"`.
    pub fn forget(&self, model: &str) {
        self.lock()
            .retain(|(_, labels), _| !labels.iter().any(|(k, v)| k == MODEL && v == model));
    }

    /// Removes every series (the controller stopped leading: another replica reports now).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// The series in Prometheus' text exposition format, one `# TYPE` line per name.
    pub fn render(&self) -> String {
        let series = self.lock();
        let mut out = String::new();
        let mut family: Option<&str> = None;
        for ((name, labels), (kind, value)) in series.iter() {
            if family != Some(name.as_str()) {
                if family.is_some() {
                    out.push('\n');
                }
                let _ = writeln!(out, "# TYPE {name} {}", kind.as_str());
                family = Some(name.as_str());
            }
            out.push_str(name);
            if !labels.is_empty() {
                out.push('{');
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{k}=\"{}\"", escape(v));
                }
                out.push('}');
            }
            let raw = value.load(Ordering::Relaxed);
            let _ = match kind {
                Kind::Counter => writeln!(out, " {raw}"),
                Kind::Gauge => writeln!(out, " {}", float(f64::from_bits(raw))),
            };
        }
        if family.is_some() {
            out.push('\n');
        }
        out
    }

    /// `render` (the exporter's text) followed by this registry's series: what `/metrics`
    /// serves.
    pub fn appended_to(self: Arc<Self>, render: Render) -> Render {
        Arc::new(move || {
            let mut text = render();
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&self.render());
            text
        })
    }

    /// The lock (a poisoned one is recovered: the values are plain numbers).
    fn lock(&self) -> MutexGuard<'_, BTreeMap<SeriesKey, Series>> {
        self.series.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value of `key`, created at zero; a name used as the other kind gets a value that
    /// is not rendered.
    fn value(&self, kind: Kind, key: &Key) -> Arc<AtomicU64> {
        let id = (
            key.name().to_string(),
            key.labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect(),
        );
        let mut series = self.lock();
        let (k, v) = series
            .entry(id)
            .or_insert_with(|| (kind, Arc::new(AtomicU64::new(0))));
        if *k == kind {
            v.clone()
        } else {
            Arc::new(AtomicU64::new(0))
        }
    }
}

impl Recorder for ModelMetrics {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.value(Kind::Counter, key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.value(Kind::Gauge, key))
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// A label value escaped as the exposition format wants it.
fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// A sample value as the exposition format writes it (`+Inf`, `-Inf`, `NaN`).
fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(m: &ModelMetrics, model: &str, backlog: f64) {
        m.record(|| {
            metrics::gauge!("tidal_autoscaler_backlog", MODEL => model.to_string()).set(backlog);
            metrics::gauge!("tidal_autoscaler_desired_replicas", MODEL => model.to_string(), "capacity" => "spot")
                .set(2.0);
            metrics::counter!("tidal_autoscaler_decisions_total", MODEL => model.to_string(), "reason" => "panic")
                .increment(1);
        });
    }

    #[test]
    fn renders_families_and_forgets_one_model() {
        let m = ModelMetrics::new();
        sample(&m, "models/a", 5.0);
        sample(&m, "models/b", 0.5);
        sample(&m, "models/a", 7.0);
        assert_eq!(
            m.render(),
            "# TYPE tidal_autoscaler_backlog gauge\n\
             tidal_autoscaler_backlog{model=\"models/a\"} 7\n\
             tidal_autoscaler_backlog{model=\"models/b\"} 0.5\n\
             \n\
             # TYPE tidal_autoscaler_decisions_total counter\n\
             tidal_autoscaler_decisions_total{model=\"models/a\",reason=\"panic\"} 2\n\
             tidal_autoscaler_decisions_total{model=\"models/b\",reason=\"panic\"} 1\n\
             \n\
             # TYPE tidal_autoscaler_desired_replicas gauge\n\
             tidal_autoscaler_desired_replicas{model=\"models/a\",capacity=\"spot\"} 2\n\
             tidal_autoscaler_desired_replicas{model=\"models/b\",capacity=\"spot\"} 2\n\
             \n"
        );
        m.forget("models/a");
        let text = m.render();
        assert!(!text.contains("models/a"), "{text}");
        assert!(
            text.contains("tidal_autoscaler_backlog{model=\"models/b\"} 0.5"),
            "{text}"
        );
        m.clear();
        assert_eq!(m.render(), "");
    }

    #[test]
    fn only_what_is_recorded_inside_record_lands_here() {
        let m = ModelMetrics::new();
        // outside `record`: not here
        metrics::gauge!("tidal_autoscaler_backlog", MODEL => "models/x").set(1.0);
        assert_eq!(m.render(), "");
        // a forgotten model's series come back only when recorded again
        sample(&m, "models/x", 3.0);
        m.forget("models/x");
        sample(&m, "models/x", 4.0);
        assert!(m
            .render()
            .contains("tidal_autoscaler_backlog{model=\"models/x\"} 4\n"));
    }

    #[test]
    fn escapes_label_values_and_writes_special_floats() {
        let m = ModelMetrics::new();
        m.record(|| {
            metrics::gauge!("g", MODEL => "a\"b\\c\nd").set(f64::INFINITY);
            metrics::gauge!("h").set(f64::NAN);
        });
        assert_eq!(
            m.render(),
            "# TYPE g gauge\ng{model=\"a\\\"b\\\\c\\nd\"} +Inf\n\n# TYPE h gauge\nh NaN\n\n"
        );
    }

    #[test]
    fn appends_to_the_exporter_text() {
        let m = Arc::new(ModelMetrics::new());
        sample(&m, "models/a", 1.0);
        let render = m
            .clone()
            .appended_to(Arc::new(|| "# TYPE up gauge\nup 1".into()));
        let text = render();
        assert!(
            text.starts_with("# TYPE up gauge\nup 1\n# TYPE tidal_autoscaler_backlog gauge\n"),
            "{text}"
        );
        m.forget("models/a");
        assert_eq!(render(), "# TYPE up gauge\nup 1\n");
    }
}
