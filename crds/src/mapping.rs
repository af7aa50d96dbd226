//! Pure translations of a `Model`'s spec into what other crates consume: the autoscaler's
//! [`ScalingSpec`], the weights' [`Source`], and the checks that
//! the schema's CEL rules also make (for clusters and tools that do not run CEL).

use std::time::Duration;

use thiserror::Error;
use tidal_autoscaler::schedule::{minute_of_day, Tz, EVERY_DAY};
use tidal_autoscaler::{
    CapacityMode as PolicyMode, FloorWindow, ScaleDownHold as PolicyHold, ScalingSpec, SpecError,
    StableAggregate,
};

use crate::spec::{
    Capacity, CapacityMode, ModelSource, ModelSpec, ScaleDownHold, Scaling, ScheduledFloor,
    SpeculativeMethodSpec, StableAggregate as SpecAggregate,
};
use crate::status::{ColdStartSource, TimeConstants};

/// Why a spec cannot be acted on.
#[derive(Debug, Error, PartialEq)]
pub enum InvalidSpec {
    /// The scaling section is inconsistent.
    #[error(transparent)]
    Scaling(#[from] SpecError),
    /// The model source is malformed.
    #[error("source: {0}")]
    Source(String),
    /// The draft model of `runtime.speculative` is missing or malformed.
    #[error("runtime.speculative.draftModel: {0}")]
    DraftModel(String),
    /// A Model in a pool sets what only its own fleet would use.
    #[error("{0}")]
    Pooled(&'static str),
    /// The node cache of a `ModelPool` names neither or both of `hostPath` and `volumeClaim`.
    #[error("cache: set exactly one of hostPath or volumeClaim")]
    PoolCache,
    /// A `ModelPool`'s spec the placement cannot act on.
    #[error(transparent)]
    Pool(#[from] tidal_autoscaler::pool::PoolSpecError),
    /// `baseOnDemandReplicas` above `maxReplicas`.
    #[error("baseOnDemandReplicas ({base}) is greater than maxReplicas ({max})")]
    BaseAboveMax {
        /// baseOnDemandReplicas
        base: u32,
        /// maxReplicas
        max: u32,
    },
    /// A price is negative.
    #[error("pricing: {0} must not be negative")]
    NegativePrice(&'static str),
    /// A `sharedPrefixes` entry has both or neither of `text` and `system`.
    #[error("runtime.sharedPrefixes[{0}]: a shared prefix has exactly one of text or system")]
    SharedPrefix(usize),
    /// A `floorSchedule` time is not "HH:MM".
    #[error("floorSchedule[{index}]: {time:?} is not a time of day as HH:MM")]
    FloorTime {
        /// position in `floorSchedule`
        index: usize,
        /// the offending value
        time: String,
    },
    /// A `floorSchedule` time zone is not in the IANA database.
    #[error(
        "floorSchedule[{index}]: unknown time zone {zone:?} (an IANA name such as \"Europe/Berlin\", \"America/New_York\" or \"UTC\")"
    )]
    FloorTimeZone {
        /// position in `floorSchedule`
        index: usize,
        /// the offending value
        zone: String,
    },
}

/// Where the weights come from, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A file inside the worker's image (or a volume it mounts).
    File {
        /// Absolute path.
        path: String,
    },
    /// A download checked against its SHA-256.
    Https {
        /// The URL.
        url: String,
        /// Expected lowercase hex SHA-256.
        sha256: String,
    },
    /// A Hugging Face Hub file.
    HuggingFace {
        /// `org/repo`.
        repo: String,
        /// Path of the file in the repository.
        file: String,
        /// Branch, tag or commit.
        revision: String,
        /// Expected SHA-256, when given.
        sha256: Option<String>,
    },
}

impl Source {
    /// The URL a downloader fetches, `None` for a local file.
    pub fn download_url(&self) -> Option<String> {
        match self {
            Source::File { .. } => None,
            Source::Https { url, .. } => Some(url.clone()),
            Source::HuggingFace {
                repo,
                file,
                revision,
                ..
            } => Some(format!(
                "https://huggingface.co/{repo}/resolve/{revision}/{file}"
            )),
        }
    }

    /// Expected SHA-256, when known.
    pub fn sha256(&self) -> Option<&str> {
        match self {
            Source::File { .. } => None,
            Source::Https { sha256, .. } => Some(sha256),
            Source::HuggingFace { sha256, .. } => sha256.as_deref(),
        }
    }

    /// The file name the worker loads (the last path segment).
    pub fn file_name(&self) -> &str {
        let path = match self {
            Source::File { path } => path.as_str(),
            Source::Https { url, .. } => url.split(['?', '#']).next().unwrap_or(url),
            Source::HuggingFace { file, .. } => file.as_str(),
        };
        path.rsplit('/').next().unwrap_or(path)
    }
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The cold start assumed for a Model that names none before any of its replicas has been
/// Ready: GPU nodes take about a minute to provision, and the shipped simulator profiles use
/// 60 s. Too long an assumption costs holds; too short a one costs requests (a 20 s cold
/// start's holds reached 88 % of requests within 2 s on the simulated GPU fleet, where those
/// of 60 s reached 99.7-100 %; docs/autoscaling.md).
pub const ASSUMED_COLD_START: Duration = Duration::from_secs(60);

/// The cold start that sizes a Model's unset time constants, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColdStart {
    /// Pod created to Ready.
    pub duration: Duration,
    /// The spec, the controller's measurement, or the assumption.
    pub source: ColdStartSource,
}

impl ColdStart {
    /// [`ASSUMED_COLD_START`]: none given, none measured yet.
    pub const ASSUMED: ColdStart = ColdStart {
        duration: ASSUMED_COLD_START,
        source: ColdStartSource::Assumed,
    };

    /// `scaling.coldStartSeconds`.
    pub fn given(duration: Duration) -> Self {
        ColdStart {
            duration,
            source: ColdStartSource::Spec,
        }
    }

    /// The controller's measurement of the Model's own replicas.
    pub fn measured(duration: Duration) -> Self {
        ColdStart {
            duration,
            source: ColdStartSource::Measured,
        }
    }
}

impl TimeConstants {
    /// The time constants of `spec` (the policy's, from [`ModelSpec::scaling_spec`]) as the
    /// status shows them, with the cold start they were sized on.
    pub fn of(spec: &ScalingSpec, cold_start: ColdStart) -> Self {
        let whole = |d: Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
        TimeConstants {
            cold_start_seconds: whole(cold_start.duration),
            cold_start_source: cold_start.source,
            stable_window_seconds: whole(spec.stable_window),
            stable_aggregate: match spec.stable_aggregate {
                StableAggregate::Mean => SpecAggregate::Mean,
                StableAggregate::Max => SpecAggregate::Max,
            },
            panic_window_seconds: spec.panic_window.as_secs_f64(),
            scale_down_delay_seconds: whole(spec.scale_down_delay),
            scale_to_zero_after_seconds: whole(spec.scale_to_zero_after),
        }
    }
}

impl ModelSpec {
    /// The cold start that sizes the time constants the spec leaves out:
    /// `scaling.coldStartSeconds`, else `measured` (the controller's), else
    /// [`ASSUMED_COLD_START`].
    pub fn cold_start(&self, measured: Option<Duration>) -> ColdStart {
        match (self.scaling.cold_start_seconds, measured) {
            (Some(s), _) => ColdStart::given(secs(s)),
            (None, Some(m)) => ColdStart::measured(m),
            (None, None) => ColdStart::ASSUMED,
        }
    }

    /// The scaling and capacity sections as the autoscaling policy reads them, validated.
    /// The time constants left out are those of [`ScalingSpec::with_cold_start`] for
    /// `cold_start` (at the spec's TTFT target); a stable window left out is at least a
    /// panic window given, so whether a spec is valid does not depend on the cold start.
    pub fn scaling_spec(&self, cold_start: ColdStart) -> Result<ScalingSpec, InvalidSpec> {
        policy_scaling(&self.scaling, &self.capacity, cold_start)
    }

    /// The weights' source, parsed and checked.
    pub fn source(&self) -> Result<Source, InvalidSpec> {
        self.source.parse().map_err(InvalidSpec::Source)
    }

    /// The draft model of `runtime.speculative` (method `draft`), parsed and checked; `None`
    /// for any other method.
    pub fn draft_source(&self) -> Result<Option<Source>, InvalidSpec> {
        let Some(spec) = &self.runtime.speculative else {
            return Ok(None);
        };
        match (spec.method, &spec.draft_model) {
            (SpeculativeMethodSpec::Draft, Some(src)) => {
                src.parse().map(Some).map_err(InvalidSpec::DraftModel)
            }
            (SpeculativeMethodSpec::Draft, None) => Err(InvalidSpec::DraftModel(
                "method draft needs draftModel".into(),
            )),
            _ => Ok(None),
        }
    }
}

impl ModelSource {
    /// The source parsed, or why it is malformed.
    pub fn parse(&self) -> Result<Source, String> {
        let src = self;
        let bad = |m: String| Err(m);
        if let Some(sha) = &src.sha256 {
            if !is_sha256(sha) {
                return bad(format!("sha256 {sha:?} is not 64 lowercase hex digits"));
            }
        }
        let uri = src.uri.as_str();
        if let Some(path) = uri.strip_prefix("file://") {
            if !path.starts_with('/') || path.len() < 2 {
                return bad(format!("{uri:?} is not an absolute file:// path"));
            }
            return Ok(Source::File { path: path.into() });
        }
        if let Some(rest) = uri.strip_prefix("https://") {
            if !rest.contains('/') || rest.starts_with('/') {
                return bad(format!("{uri:?} has no host and path"));
            }
            return match &src.sha256 {
                Some(sha) => Ok(Source::Https {
                    url: uri.into(),
                    sha256: sha.clone(),
                }),
                None => bad(format!("{uri:?} needs sha256")),
            };
        }
        if let Some(rest) = uri.strip_prefix("hf://") {
            let mut parts = rest.splitn(3, '/');
            let (Some(org), Some(repo), Some(file)) = (parts.next(), parts.next(), parts.next())
            else {
                return bad(format!("{uri:?} is not hf://org/repo/file"));
            };
            if org.is_empty() || repo.is_empty() || file.is_empty() || file.ends_with('/') {
                return bad(format!("{uri:?} is not hf://org/repo/file"));
            }
            return Ok(Source::HuggingFace {
                repo: format!("{org}/{repo}"),
                file: file.into(),
                revision: src.revision.clone().unwrap_or_else(|| "main".into()),
                sha256: src.sha256.clone(),
            });
        }
        bad(format!("{uri:?}: expected file://, https:// or hf://"))
    }
}

impl ModelSpec {
    /// Every check the reconciler needs before acting; the policy's spec with the time
    /// constants left out sized on `cold_start`.
    pub fn validate(&self, cold_start: ColdStart) -> Result<ScalingSpec, InvalidSpec> {
        self.check_pooled()?;
        self.source()?;
        self.draft_source()?;
        for (field, v) in [
            (
                "inputPerMillionMicros",
                self.pricing.input_per_million_micros,
            ),
            (
                "cachedInputPerMillionMicros",
                self.pricing.cached_input_per_million_micros,
            ),
            (
                "outputPerMillionMicros",
                self.pricing.output_per_million_micros,
            ),
        ] {
            if v < 0 {
                return Err(InvalidSpec::NegativePrice(field));
            }
        }
        if let Some(index) = self
            .runtime
            .shared_prefixes
            .iter()
            .position(|p| p.text.is_some() == p.system.is_some())
        {
            return Err(InvalidSpec::SharedPrefix(index));
        }
        self.scaling_spec(cold_start)
    }
}

/// A fleet's `scaling` and `capacity` sections as the autoscaling policy reads them,
/// validated (a Model's own fleet, or a `ModelPool`'s workers). The time constants left out
/// are those of [`ScalingSpec::with_cold_start`] for `cold_start` (at the spec's TTFT
/// target); a stable window left out is at least a panic window given, so whether a spec is
/// valid does not depend on the cold start.
pub(crate) fn policy_scaling(
    s: &Scaling,
    c: &Capacity,
    cold_start: ColdStart,
) -> Result<ScalingSpec, InvalidSpec> {
    let ttft_target = Duration::from_millis(u64::from(s.ttft_target_milliseconds));
    let sized = ScalingSpec {
        ttft_target,
        ..ScalingSpec::default()
    }
    .with_cold_start(cold_start.duration);
    let panic_given = s.panic_window_seconds.map(secs);
    let stable_window = s
        .stable_window_seconds
        .map(secs)
        .unwrap_or_else(|| sized.stable_window.max(panic_given.unwrap_or_default()));
    let spec = ScalingSpec {
        min_replicas: s.min_replicas,
        max_replicas: s.max_replicas,
        target_in_flight_per_replica: f64::from(s.target_in_flight_per_replica),
        scale_to_zero_after: s
            .scale_to_zero_after_seconds
            .map_or(sized.scale_to_zero_after, secs),
        stable_window,
        stable_aggregate: match s.stable_aggregate {
            None => sized.stable_aggregate,
            Some(SpecAggregate::Mean) => StableAggregate::Mean,
            Some(SpecAggregate::Max) => StableAggregate::Max,
        },
        // a tenth of the stable window, as the sized spec's; 1 s at least (the schema's floor)
        panic_window: panic_given
            .unwrap_or_else(|| (stable_window / 10).max(Duration::from_secs(1))),
        panic_threshold: f64::from(s.panic_threshold_percent) / 100.0,
        scale_down_delay: s
            .scale_down_delay_seconds
            .map_or(sized.scale_down_delay, secs),
        scale_down_hold: match s.scale_down_hold {
            ScaleDownHold::Flat => PolicyHold::Flat,
            ScaleDownHold::PerLevel => PolicyHold::PerLevel,
        },
        max_scale_up_rate: s.max_scale_up_rate,
        max_scale_down_rate: s.max_scale_down_rate,
        capacity_mode: match c.mode {
            CapacityMode::Spot => PolicyMode::Spot,
            CapacityMode::OnDemand => PolicyMode::OnDemand,
            CapacityMode::SpotWithFallback => PolicyMode::SpotWithFallback,
        },
        base_on_demand_replicas: c.base_on_demand_replicas,
        fallback_after: secs(c.fallback_after_seconds),
        prefill_tokens_per_second: f64::from(s.prefill_tokens_per_second),
        ttft_target,
        decoding_weight: f64::from(s.decoding_weight_percent) / 100.0,
        floor_schedule: s
            .floor_schedule
            .iter()
            .enumerate()
            .map(|(index, w)| floor_window(index, w))
            .collect::<Result<_, _>>()?,
        ..ScalingSpec::default()
    };
    spec.validate()?;
    if c.base_on_demand_replicas > s.max_replicas {
        return Err(InvalidSpec::BaseAboveMax {
            base: c.base_on_demand_replicas,
            max: s.max_replicas,
        });
    }
    Ok(spec)
}

fn secs(s: u32) -> Duration {
    Duration::from_secs(u64::from(s))
}

/// One `floorSchedule` entry as the policy reads it: days as a mask (none listed: every day),
/// times as minutes after local midnight, the zone parsed (none given: UTC).
fn floor_window(index: usize, w: &ScheduledFloor) -> Result<FloorWindow, InvalidSpec> {
    let minute = |time: &str| {
        minute_of_day(time).ok_or_else(|| InvalidSpec::FloorTime {
            index,
            time: time.to_string(),
        })
    };
    let days = match w.days.as_slice() {
        [] => EVERY_DAY,
        days => days.iter().fold(0, |mask, d| mask | 1 << (*d as u8)),
    };
    let time_zone = match &w.time_zone {
        None => Tz::UTC,
        Some(zone) => zone.parse().map_err(|_| InvalidSpec::FloorTimeZone {
            index,
            zone: zone.clone(),
        })?,
    };
    Ok(FloorWindow {
        days,
        start_minute: minute(&w.start)?,
        end_minute: minute(&w.end)?,
        min_replicas: w.min_replicas,
        time_zone,
    })
}
