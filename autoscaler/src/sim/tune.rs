//! `tidal sim --tune`: replays our policy under a grid of its time constants (stable window
//! and how it sums demand, scale-down delay, scale-to-zero time, decoding weight) on one or
//! more samples of the traffic (seeds: thinnings, interruptions, outages) and picks the
//! cheapest setting that reaches the SLO target on every sample. It is what an operator
//! otherwise does by hand with `tidal sim --trace` before writing a Model's `scaling` block,
//! so it prints that block too. The result is in-sample: a setting tuned on one sample tends
//! to just reach the target on it and miss it on others, which is why several samples and
//! the worst of them count (docs/autoscaling.md, "Tuning").

use super::report::{self, PolicySummary};
use super::{run_policy, SimConfig};
use crate::spec::{ScalingSpec, StableAggregate};
use serde::Serialize;
use std::time::Duration;

/// The values tried for each time constant; every combination is replayed.
#[derive(Debug, Clone, PartialEq)]
pub struct Grid {
    /// Stable windows, seconds (the panic window is a tenth).
    pub stable_windows_s: Vec<u32>,
    /// How stable mode sums the window's demand.
    pub aggregates: Vec<StableAggregate>,
    /// Scale-down delays, seconds.
    pub scale_down_delays_s: Vec<u32>,
    /// Idle times before scaling to zero, seconds.
    pub scale_to_zero_after_s: Vec<u32>,
    /// Decoding weights, percent.
    pub decoding_weights_percent: Vec<u32>,
}

impl Default for Grid {
    /// From Knative's defaults to the slow-cold-start preset and past it: 320 settings.
    fn default() -> Self {
        Self {
            stable_windows_s: vec![60, 120, 180, 300, 600],
            aggregates: vec![StableAggregate::Mean, StableAggregate::Max],
            scale_down_delays_s: vec![0, 120, 300, 600],
            scale_to_zero_after_s: vec![120, 300, 600, 1200],
            decoding_weights_percent: vec![50, 100],
        }
    }
}

/// One setting of the time constants, in the units of a Model's `scaling` block.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Setting {
    /// `stableWindowSeconds` (`panicWindowSeconds` is a tenth, at least 1).
    pub stable_window_s: u32,
    /// `stableAggregate`.
    pub stable_aggregate: StableAggregate,
    /// `scaleDownDelaySeconds`.
    pub scale_down_delay_s: u32,
    /// `scaleToZeroAfterSeconds`.
    pub scale_to_zero_after_s: u32,
    /// `decodingWeightPercent`.
    pub decoding_weight_percent: u32,
}

impl Setting {
    /// The time constants of `spec`, in whole seconds and percent.
    pub fn of(spec: &ScalingSpec) -> Self {
        let s = |d: Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
        Self {
            stable_window_s: s(spec.stable_window),
            stable_aggregate: spec.stable_aggregate,
            scale_down_delay_s: s(spec.scale_down_delay),
            scale_to_zero_after_s: s(spec.scale_to_zero_after),
            decoding_weight_percent: (spec.decoding_weight * 100.0).round() as u32,
        }
    }

    /// `panicWindowSeconds`: a tenth of the stable window, as the preset and Knative have it.
    pub fn panic_window_s(&self) -> u32 {
        (self.stable_window_s / 10).max(1)
    }

    /// `base` with these time constants; every other field (bounds, target, capacity,
    /// prefill sizing, floors) is kept.
    pub fn apply(&self, base: &ScalingSpec) -> ScalingSpec {
        let s = |x: u32| Duration::from_secs(u64::from(x));
        ScalingSpec {
            stable_window: s(self.stable_window_s),
            panic_window: s(self.panic_window_s()),
            stable_aggregate: self.stable_aggregate,
            scale_down_delay: s(self.scale_down_delay_s),
            scale_to_zero_after: s(self.scale_to_zero_after_s),
            decoding_weight: f64::from(self.decoding_weight_percent) / 100.0,
            ..base.clone()
        }
    }

    /// The setting as the lines of a Model's `scaling` block (two-space indented, under
    /// `scaling:`).
    pub fn scaling_yaml(&self) -> String {
        let aggregate = match self.stable_aggregate {
            StableAggregate::Mean => "Mean",
            StableAggregate::Max => "Max",
        };
        format!(
            "scaling:\n  stableWindowSeconds: {}\n  stableAggregate: {aggregate}\n  panicWindowSeconds: {}\n  scaleDownDelaySeconds: {}\n  scaleToZeroAfterSeconds: {}\n  decodingWeightPercent: {}\n",
            self.stable_window_s,
            self.panic_window_s(),
            self.scale_down_delay_s,
            self.scale_to_zero_after_s,
            self.decoding_weight_percent,
        )
    }
}

/// One sample of the traffic and the oracle's cost on it.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The simulation; its first `ours` spec is the base every setting is applied to.
    pub cfg: SimConfig,
    /// The oracle's cost on it, micro-units.
    pub oracle_cost: u64,
}

/// One setting replayed on every sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tried {
    /// The setting.
    pub setting: Setting,
    /// Its cost over all samples, micro-units.
    pub cost_micros: u64,
    /// That cost relative to the oracle's over all samples.
    pub cost_vs_oracle: f64,
    /// Its SLO attainment on the sample where it is lowest.
    pub slo_attainment: f64,
}

/// What the grid gave.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tuning {
    /// The SLO attainment a setting must reach on every sample.
    pub slo_target: f64,
    /// Samples each setting was replayed on.
    pub samples: usize,
    /// Settings replayed.
    pub tried: usize,
    /// The cheapest setting reaching the target (the higher attainment on a tie), if any.
    pub best: Option<Tried>,
    /// The settings no other beats on both cost and attainment, cheapest first: what each
    /// step of attainment costs.
    pub frontier: Vec<Tried>,
    /// The preset (`ours-coldstart`) replayed the same way, for comparison.
    pub preset: Option<Tried>,
    /// Whether the replays start from an empty fleet (no warm-up), whose first cold start
    /// every request of the first minute waits for.
    pub from_empty: bool,
}

/// Replays every setting of `grid` on every sample and picks the cheapest reaching
/// `slo_target` on all of them; `preset` is replayed the same way for comparison.
pub fn tune(samples: &[Sample], grid: &Grid, preset: Option<Setting>, slo_target: f64) -> Tuning {
    let tried = replay_all(&settings(grid), threads(), |s| replay(samples, s));
    let count = tried.len();
    let (best, frontier) = pick(tried, slo_target);
    Tuning {
        slo_target,
        samples: samples.len(),
        tried: count,
        best,
        frontier,
        preset: preset.and_then(|p| replay(samples, p)),
        from_empty: samples
            .iter()
            .any(|s| s.cfg.fleet.warm_up.requests.is_empty()),
    }
}

/// The cheapest of `tried` reaching `slo_target` (the higher attainment on a tie), and the
/// frontier: the settings no other beats on both cost and attainment, cheapest first.
pub fn pick(mut tried: Vec<Tried>, slo_target: f64) -> (Option<Tried>, Vec<Tried>) {
    // cheapest first, the higher attainment first among equal costs
    tried.sort_by(|a, b| {
        a.cost_micros
            .cmp(&b.cost_micros)
            .then(b.slo_attainment.total_cmp(&a.slo_attainment))
    });
    let best = tried
        .iter()
        .find(|t| t.slo_attainment >= slo_target)
        .cloned();
    let mut frontier: Vec<Tried> = Vec::new();
    for t in tried {
        if frontier
            .last()
            .is_none_or(|f| t.slo_attainment > f.slo_attainment)
        {
            frontier.push(t);
        }
    }
    (best, frontier)
}

/// Threads for the replays: the machine's cores.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `replay` of every setting, in the settings' order whatever the number of `threads` (the
/// replays are independent: one chunk of the settings per thread); settings it refuses
/// (`None`) are left out.
pub fn replay_all<T: Send>(
    all: &[Setting],
    threads: usize,
    replay: impl Fn(Setting) -> Option<T> + Sync,
) -> Vec<T> {
    let chunk = all.len().div_ceil(threads.max(1)).max(1);
    let replay = &replay;
    std::thread::scope(|scope| {
        let workers: Vec<_> = all
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || part.iter().filter_map(|s| replay(*s)).collect::<Vec<_>>())
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// `setting` on every sample (`None` for a setting the policy refuses).
fn replay(samples: &[Sample], setting: Setting) -> Option<Tried> {
    let (mut cost, mut oracle, mut worst) = (0u64, 0u64, f64::INFINITY);
    for sample in samples {
        let cfg = &sample.cfg;
        let base = cfg
            .ours
            .first()
            .map_or_else(ScalingSpec::default, |(_, s)| s.clone());
        let spec = setting.apply(&base);
        spec.validate().ok()?;
        let mut ours = cfg.our_policy("ours-tuned", spec);
        let run = run_policy(&cfg.requests, &cfg.fleet, &mut ours);
        let s: PolicySummary =
            report::summarise(run, &cfg.requests, &cfg.fleet.profile, sample.oracle_cost);
        cost = cost.saturating_add(s.cost_micros);
        oracle = oracle.saturating_add(sample.oracle_cost);
        worst = worst.min(s.slo_attainment);
    }
    (!samples.is_empty()).then(|| Tried {
        setting,
        cost_micros: cost,
        cost_vs_oracle: cost as f64 / oracle.max(1) as f64,
        slo_attainment: worst,
    })
}

/// Every combination of the grid's values.
pub fn settings(grid: &Grid) -> Vec<Setting> {
    let mut out = Vec::new();
    for &stable_window_s in &grid.stable_windows_s {
        for &stable_aggregate in &grid.aggregates {
            for &scale_down_delay_s in &grid.scale_down_delays_s {
                for &scale_to_zero_after_s in &grid.scale_to_zero_after_s {
                    for &decoding_weight_percent in &grid.decoding_weights_percent {
                        out.push(Setting {
                            stable_window_s,
                            stable_aggregate,
                            scale_down_delay_s,
                            scale_to_zero_after_s,
                            decoding_weight_percent,
                        });
                    }
                }
            }
        }
    }
    out
}

/// The tuning as text: the best setting against the preset, the frontier and the `scaling`
/// block.
pub fn render(t: &Tuning) -> String {
    let describe = |s: &Setting| {
        format!(
            "stable window {} s ({:?}), scale-down delay {} s, scale to zero after {} s, decoding weight {} %",
            s.stable_window_s,
            s.stable_aggregate,
            s.scale_down_delay_s,
            s.scale_to_zero_after_s,
            s.decoding_weight_percent
        )
    };
    let mut out = format!(
        "\ntuning: {} settings of ours' time constants, each replayed on {} sample(s) of this traffic; SLO is the lowest over the samples (in-sample: check it on other traffic)\n",
        t.tried, t.samples
    );
    match &t.best {
        Some(b) => out.push_str(&format!(
            "cheapest reaching {:.0}% SLO: {} — {:.2}x oracle, {:.2}% SLO\n",
            t.slo_target * 100.0,
            describe(&b.setting),
            b.cost_vs_oracle,
            b.slo_attainment * 100.0
        )),
        None => {
            out.push_str(&format!(
                "no setting reaches {:.0}% SLO; the frontier below shows what each costs\n",
                t.slo_target * 100.0
            ));
            if t.from_empty {
                out.push_str("(every replay starts from an empty fleet, so the requests of its first cold start wait for it; --warm-up measures the steady state)\n");
            }
        }
    }
    if let Some(p) = &t.preset {
        out.push_str(&format!(
            "the preset (ours-coldstart's {}) for comparison: {:.2}x oracle, {:.2}% SLO\n",
            describe(&p.setting),
            p.cost_vs_oracle,
            p.slo_attainment * 100.0
        ));
    }
    out.push_str(&format!(
        "frontier (each setting reaches more than every cheaper one):\n{:>8} {:>8} {:>7} {:>5} {:>6} {:>6} {:>4}\n",
        "xoracle", "SLO", "stable", "agg", "delay", "zero", "dw%"
    ));
    for f in &t.frontier {
        let s = &f.setting;
        out.push_str(&format!(
            "{:>8.2} {:>7.2}% {:>7} {:>5} {:>6} {:>6} {:>4}\n",
            f.cost_vs_oracle,
            f.slo_attainment * 100.0,
            s.stable_window_s,
            format!("{:?}", s.stable_aggregate),
            s.scale_down_delay_s,
            s.scale_to_zero_after_s,
            s.decoding_weight_percent
        ));
    }
    if let Some(b) = &t.best {
        out.push_str("\nfor the Model (spec.scaling, with your bounds and sizing):\n");
        out.push_str(&b.setting.scaling_yaml());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::tests::small_cfg;

    fn setting() -> Setting {
        Setting {
            stable_window_s: 120,
            stable_aggregate: StableAggregate::Max,
            scale_down_delay_s: 300,
            scale_to_zero_after_s: 600,
            decoding_weight_percent: 50,
        }
    }

    /// 16 settings around the trade-off of [`small_cfg`].
    fn grid() -> Grid {
        Grid {
            stable_windows_s: vec![30, 300],
            aggregates: vec![StableAggregate::Mean, StableAggregate::Max],
            scale_down_delays_s: vec![0, 300],
            scale_to_zero_after_s: vec![60, 600],
            decoding_weights_percent: vec![100],
        }
    }

    fn sample(seed: u64) -> Sample {
        Sample {
            cfg: small_cfg(seed),
            oracle_cost: 1_000,
        }
    }

    #[test]
    fn a_setting_sets_the_time_constants_and_keeps_the_rest() {
        let base = ScalingSpec {
            max_replicas: 7,
            prefill_tokens_per_second: 5_000.0,
            ..ScalingSpec::default()
        };
        let s = setting();
        let spec = s.apply(&base);
        assert_eq!(
            spec,
            ScalingSpec {
                stable_window: Duration::from_secs(120),
                panic_window: Duration::from_secs(12),
                stable_aggregate: StableAggregate::Max,
                scale_down_delay: Duration::from_secs(300),
                scale_to_zero_after: Duration::from_secs(600),
                decoding_weight: 0.5,
                ..base
            }
        );
        assert_eq!(Setting::of(&spec), s);
        // the preset of a 60 s cold start, as a setting
        let preset = ScalingSpec::for_cold_start(Duration::from_secs(60));
        assert_eq!(
            Setting::of(&preset),
            Setting {
                stable_window_s: 300,
                scale_to_zero_after_s: 600,
                decoding_weight_percent: 100,
                ..s
            }
        );
        assert_eq!(
            s.scaling_yaml(),
            "scaling:\n  stableWindowSeconds: 120\n  stableAggregate: Max\n  panicWindowSeconds: 12\n  scaleDownDelaySeconds: 300\n  scaleToZeroAfterSeconds: 600\n  decodingWeightPercent: 50\n"
        );
        // a window under 10 s still gets a panic window
        let short = Setting {
            stable_window_s: 5,
            ..s
        };
        assert_eq!(short.panic_window_s(), 1);
    }

    /// Each setting of the grid replayed on its own: (setting, cost, attainment).
    fn replayed_alone(sample: &Sample) -> Vec<(Setting, u64, f64)> {
        let cfg = &sample.cfg;
        settings(&grid())
            .into_iter()
            .map(|s| {
                let mut ours = cfg.our_policy("x", s.apply(&cfg.ours[0].1));
                let run = run_policy(&cfg.requests, &cfg.fleet, &mut ours);
                let r = report::summarise(run, &cfg.requests, &cfg.fleet.profile, 1_000);
                (s, r.cost_micros, r.slo_attainment)
            })
            .collect()
    }

    #[test]
    fn the_grid_replays_every_setting_and_picks_the_cheapest_that_reaches_the_target() {
        // prompts of the exponential tail take longer than the target to prefill on any
        // fleet, so the tiny profile's best is about 98.4 %
        let target = 0.98;
        let one = [sample(3)];
        let t = tune(&one, &grid(), Some(setting()), target);
        assert_eq!((t.samples, t.tried), (1, 16));
        let replayed = replayed_alone(&one[0]);
        let cheapest_meeting = replayed
            .iter()
            .filter(|(_, _, slo)| *slo >= target)
            .map(|(_, cost, _)| *cost)
            .min();
        let best = t.best.clone().expect("some setting reaches the target");
        assert_eq!(Some(best.cost_micros), cheapest_meeting);
        assert!(replayed.contains(&(best.setting, best.cost_micros, best.slo_attainment)));
        assert_eq!(best.cost_vs_oracle, best.cost_micros as f64 / 1_000.0);
        // the scenario has a trade-off: some cheaper setting misses the target
        assert!(replayed
            .iter()
            .any(|(_, cost, slo)| *cost < best.cost_micros && *slo < target));
        // the frontier: cheapest first, each reaching more than the one before, and no
        // replayed setting both cheaper and better than one of its points
        assert!(t.frontier.contains(&best));
        for w in t.frontier.windows(2) {
            assert!(w[0].cost_micros <= w[1].cost_micros);
            assert!(w[0].slo_attainment < w[1].slo_attainment);
        }
        for f in &t.frontier {
            assert!(!replayed.iter().any(|(_, cost, slo)| *cost <= f.cost_micros
                && *slo >= f.slo_attainment
                && (*cost, *slo) != (f.cost_micros, f.slo_attainment)));
        }
        // the preset is replayed the same way, off the grid
        assert_eq!(t.preset.as_ref().map(|p| p.setting), Some(setting()));
        let text = render(&t);
        assert!(text.contains("tuning: 16 settings"), "{text}");
        assert!(
            text.contains("the preset (ours-coldstart's stable window 120 s"),
            "{text}"
        );
        assert!(text.contains(&best.setting.scaling_yaml()), "{text}");
    }

    #[test]
    fn the_replays_come_back_in_grid_order_on_any_number_of_threads() {
        let one = [sample(3)];
        let all = settings(&grid());
        let serial = replay_all(&all, 1, |s| replay(&one, s));
        assert_eq!(serial.len(), 16);
        assert!(serial.iter().zip(&all).all(|(t, s)| t.setting == *s));
        for threads in [3, 16, 64] {
            let parallel = replay_all(&all, threads, |s| replay(&one, s));
            assert_eq!(parallel, serial, "{threads} threads");
        }
    }

    #[test]
    fn over_several_samples_a_setting_costs_their_sum_and_reaches_their_worst() {
        let (a, b) = (sample(3), sample(4));
        let both = tune(&[a.clone(), b.clone()], &grid(), None, 0.98);
        assert_eq!((both.samples, both.tried), (2, 16));
        let (ra, rb) = (replayed_alone(&a), replayed_alone(&b));
        for f in &both.frontier {
            let i = ra.iter().position(|r| r.0 == f.setting).unwrap();
            assert_eq!(f.cost_micros, ra[i].1 + rb[i].1);
            assert_eq!(f.slo_attainment, ra[i].2.min(rb[i].2));
            assert_eq!(f.cost_vs_oracle, f.cost_micros as f64 / 2_000.0);
        }
    }

    #[test]
    fn a_target_no_setting_reaches_is_said_and_gets_no_block() {
        // scale to zero after a second: every burst waits for a cold start
        let grid = Grid {
            stable_windows_s: vec![30],
            aggregates: vec![StableAggregate::Mean],
            scale_down_delays_s: vec![0],
            scale_to_zero_after_s: vec![1],
            decoding_weights_percent: vec![100],
        };
        let t = tune(&[sample(3)], &grid, None, 0.99);
        assert_eq!((t.tried, t.best.clone(), t.preset.clone()), (1, None, None));
        assert_eq!(t.frontier.len(), 1);
        let text = render(&t);
        assert!(text.contains("no setting reaches 99% SLO"), "{text}");
        assert!(!text.contains("scaling:"), "{text}");
        assert!(!text.contains("--warm-up"), "{text}");
        // from an empty fleet, the first cold start is named as a reason
        let mut cold = sample(3);
        cold.cfg.fleet.warm_up = crate::sim::WarmUp::default();
        let t = tune(&[cold], &grid, None, 0.99);
        assert!(t.from_empty);
        assert!(render(&t).contains("--warm-up measures the steady state"));
    }
}
