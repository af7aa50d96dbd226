//! Request traces: the Azure LLM inference trace CSV, its transformations (thin, stretch,
//! repeat) and a seeded synthetic diurnal/bursty generator.

use chrono::NaiveDateTime;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::path::Path;
use thiserror::Error;

/// One request of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Request {
    /// Arrival, milliseconds from the start of the trace.
    pub arrival_ms: u64,
    /// Prompt (context) tokens.
    pub prompt_tokens: u32,
    /// Generated tokens (at least 1).
    pub generated_tokens: u32,
}

/// A trace that could not be read.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The file could not be opened or a record could not be read.
    #[error("reading {path}: {source}")]
    Csv {
        /// the trace file
        path: String,
        /// the csv error
        source: csv::Error,
    },
    /// A field did not parse.
    #[error("{path} line {line}: {what}")]
    Field {
        /// the trace file
        path: String,
        /// 1-based line number
        line: u64,
        /// what was wrong
        what: String,
    },
    /// The trace holds no requests.
    #[error("{0} holds no requests")]
    Empty(String),
}

/// Reads a trace CSV with columns `TIMESTAMP,ContextTokens,GeneratedTokens`; arrivals are made
/// relative to the earliest request and the result is sorted by arrival.
pub fn load_csv(path: &Path) -> Result<Vec<Request>, TraceError> {
    load_csv_with_start(path).map(|(requests, _)| requests)
}

/// [`load_csv`], and the trace's first timestamp (as written: the shipped trace's are UTC).
pub fn load_csv_with_start(path: &Path) -> Result<(Vec<Request>, NaiveDateTime), TraceError> {
    let name = path.display().to_string();
    let mut reader = csv::Reader::from_path(path).map_err(|source| TraceError::Csv {
        path: name.clone(),
        source,
    })?;
    let mut rows = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let record = record.map_err(|source| TraceError::Csv {
            path: name.clone(),
            source,
        })?;
        let line = i as u64 + 2;
        let field = |what: String| TraceError::Field {
            path: name.clone(),
            line,
            what,
        };
        let get = |idx: usize| {
            record
                .get(idx)
                .ok_or_else(|| field(format!("missing column {idx}")))
        };
        let ts = get(0)?.trim();
        let at = NaiveDateTime::parse_from_str(ts, "%Y-%m-%d %H:%M:%S%.f")
            .map_err(|e| field(format!("timestamp {ts:?}: {e}")))?;
        let prompt: u32 = get(1)?
            .trim()
            .parse()
            .map_err(|e| field(format!("ContextTokens: {e}")))?;
        let generated: u32 = get(2)?
            .trim()
            .parse()
            .map_err(|e| field(format!("GeneratedTokens: {e}")))?;
        rows.push((at, prompt, generated));
    }
    let start = rows
        .iter()
        .map(|r| r.0)
        .min()
        .ok_or_else(|| TraceError::Empty(name.clone()))?;
    let mut out: Vec<Request> = rows
        .into_iter()
        .map(|(at, prompt, generated)| Request {
            arrival_ms: (at - start).num_milliseconds().max(0) as u64,
            prompt_tokens: prompt.max(1),
            generated_tokens: generated.max(1),
        })
        .collect();
    out.sort_by_key(|r| r.arrival_ms);
    Ok((out, start))
}

/// Keeps each request with probability `fraction` (seeded), the scale-to-zero regime at low
/// fractions.
pub fn thin(requests: &[Request], fraction: f64, seed: u64) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    requests
        .iter()
        .copied()
        .filter(|_| rng.random::<f64>() < fraction)
        .collect()
}

/// Multiplies every arrival time by `factor` (above 1 stretches, below 1 compresses).
pub fn scale_time(requests: &[Request], factor: f64) -> Vec<Request> {
    requests
        .iter()
        .map(|r| Request {
            arrival_ms: (r.arrival_ms as f64 * factor).round() as u64,
            ..*r
        })
        .collect()
}

/// Plays the trace `times` times back to back, each copy `period_ms` after the previous.
pub fn repeat(requests: &[Request], times: u32, period_ms: u64) -> Vec<Request> {
    (0..u64::from(times))
        .flat_map(|k| {
            requests.iter().map(move |r| Request {
                arrival_ms: r.arrival_ms + k * period_ms,
                ..*r
            })
        })
        .collect()
}

/// Length of a trace for repetition: last arrival plus the mean gap between arrivals.
pub fn period_ms(requests: &[Request]) -> u64 {
    match (requests.first(), requests.last()) {
        (Some(a), Some(b)) if requests.len() > 1 => {
            let span = b.arrival_ms - a.arrival_ms;
            b.arrival_ms + span / (requests.len() as u64 - 1)
        }
        (Some(a), _) => a.arrival_ms + 1000,
        _ => 0,
    }
}

/// Parameters of the synthetic generator.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Synthetic {
    /// Trace length in seconds.
    pub duration_s: f64,
    /// Mean arrival rate (requests/s) before bursts.
    pub mean_rps: f64,
    /// Relative amplitude of the sinusoidal (diurnal) rate, 0..1.
    pub diurnal_amplitude: f64,
    /// Period of the sinusoid in seconds.
    pub period_s: f64,
    /// Bursts per hour (Poisson).
    pub bursts_per_hour: f64,
    /// Rate multiplier during a burst.
    pub burst_multiplier: f64,
    /// Burst length in seconds.
    pub burst_s: f64,
    /// Mean prompt tokens (exponentially distributed).
    pub prompt_mean: f64,
    /// Mean generated tokens (exponentially distributed).
    pub generated_mean: f64,
    /// RNG seed.
    pub seed: u64,
}

fn exp_sample(rng: &mut ChaCha8Rng, mean: f64) -> f64 {
    // 1 - U lies in (0, 1], so ln is finite.
    -(1.0 - rng.random::<f64>()).ln() * mean
}

/// Generates a non-homogeneous Poisson trace (Lewis-Shedler thinning).
pub fn synthetic(p: &Synthetic) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
    let mut bursts = Vec::new();
    let mut t = 0.0;
    if p.bursts_per_hour > 0.0 {
        loop {
            t += exp_sample(&mut rng, 3600.0 / p.bursts_per_hour);
            if t >= p.duration_s {
                break;
            }
            bursts.push(t);
        }
    }
    let amp = p.diurnal_amplitude.clamp(0.0, 1.0);
    let rate = |t: f64| {
        let base = p.mean_rps * (1.0 + amp * (std::f64::consts::TAU * t / p.period_s).sin());
        let in_burst = bursts.iter().any(|b| t >= *b && t < *b + p.burst_s);
        base * if in_burst {
            p.burst_multiplier.max(1.0)
        } else {
            1.0
        }
    };
    let peak = p.mean_rps * (1.0 + amp) * p.burst_multiplier.max(1.0);
    let mut out = Vec::new();
    if peak <= 0.0 {
        return out;
    }
    let mut t = 0.0;
    loop {
        t += exp_sample(&mut rng, 1.0 / peak);
        if t >= p.duration_s {
            break;
        }
        if rng.random::<f64>() * peak < rate(t) {
            out.push(Request {
                arrival_ms: (t * 1000.0) as u64,
                prompt_tokens: exp_sample(&mut rng, p.prompt_mean).ceil().max(1.0) as u32,
                generated_tokens: exp_sample(&mut rng, p.generated_mean).ceil().max(1.0) as u32,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn req(ms: u64) -> Request {
        Request {
            arrival_ms: ms,
            prompt_tokens: 10,
            generated_tokens: 2,
        }
    }

    #[test]
    fn csv_is_parsed_relative_to_the_first_request() {
        let dir = std::env::temp_dir().join(format!("tidal-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.csv");
        let mut f = std::fs::File::create(&path).unwrap();
        writeln!(f, "TIMESTAMP,ContextTokens,GeneratedTokens").unwrap();
        writeln!(f, "2023-11-16 18:17:04.5000000,100,0").unwrap();
        writeln!(f, "2023-11-16 18:17:03.9799600,4808,10").unwrap();
        drop(f);
        let (got, start) = load_csv_with_start(&path).unwrap();
        assert_eq!(start.to_string(), "2023-11-16 18:17:03.979960");
        assert_eq!(load_csv(&path).unwrap(), got);
        assert_eq!(
            got,
            vec![
                Request {
                    arrival_ms: 0,
                    prompt_tokens: 4808,
                    generated_tokens: 10
                },
                Request {
                    arrival_ms: 520,
                    prompt_tokens: 100,
                    generated_tokens: 1
                },
            ]
        );
    }

    #[test]
    fn bad_fields_name_the_line() {
        let path = std::env::temp_dir().join(format!("tidal-bad-{}.csv", std::process::id()));
        std::fs::write(
            &path,
            "TIMESTAMP,ContextTokens,GeneratedTokens\nnot-a-time,1,1\n",
        )
        .unwrap();
        let err = load_csv(&path).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn shipped_trace_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/traces/azure-llm-2023-code.csv");
        let reqs = load_csv(&path).unwrap();
        assert_eq!(reqs.len(), 8819);
        let span_s = reqs.last().unwrap().arrival_ms / 1000;
        assert!((3300..=3700).contains(&span_s), "{span_s}");
    }

    #[test]
    fn thinning_is_seeded_and_keeps_about_the_fraction() {
        let reqs: Vec<_> = (0..10_000).map(req).collect();
        let a = thin(&reqs, 0.05, 7);
        assert_eq!(a, thin(&reqs, 0.05, 7));
        assert_ne!(a, thin(&reqs, 0.05, 8));
        assert!((400..600).contains(&a.len()), "{}", a.len());
        assert_eq!(thin(&reqs, 1.0, 1).len(), 10_000);
        assert!(thin(&reqs, 0.0, 1).is_empty());
    }

    #[test]
    fn scaling_and_repeating_move_arrivals() {
        let reqs = vec![req(0), req(1000), req(3000)];
        assert_eq!(
            scale_time(&reqs, 2.0)
                .iter()
                .map(|r| r.arrival_ms)
                .collect::<Vec<_>>(),
            [0, 2000, 6000]
        );
        assert_eq!(period_ms(&reqs), 4500);
        let rep = repeat(&reqs, 2, 4500);
        assert_eq!(
            rep.iter().map(|r| r.arrival_ms).collect::<Vec<_>>(),
            [0, 1000, 3000, 4500, 5500, 7500]
        );
    }

    #[test]
    fn synthetic_is_seeded_sorted_and_near_the_mean_rate() {
        let p = Synthetic {
            duration_s: 3600.0,
            mean_rps: 2.0,
            diurnal_amplitude: 0.5,
            period_s: 3600.0,
            bursts_per_hour: 0.0,
            burst_multiplier: 1.0,
            burst_s: 60.0,
            prompt_mean: 500.0,
            generated_mean: 50.0,
            seed: 3,
        };
        let a = synthetic(&p);
        assert_eq!(a, synthetic(&p));
        assert!(a.windows(2).all(|w| w[0].arrival_ms <= w[1].arrival_ms));
        assert!((6500..7900).contains(&a.len()), "{}", a.len());
        // the first half of the sine period is busier than the second
        let first = a.iter().filter(|r| r.arrival_ms < 1_800_000).count();
        assert!(first as f64 > 1.5 * (a.len() - first) as f64);
        let bursty = synthetic(&Synthetic {
            bursts_per_hour: 6.0,
            burst_multiplier: 10.0,
            ..p
        });
        assert!(bursty.len() > a.len());
    }
}
