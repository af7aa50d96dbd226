//! `tidal sim --pool` as text: the inputs and where they come from, the rows, the pool's
//! loads, the search's settings and the verdict.

use super::pool_compare::PoolReport;
use super::pool_engine::PoolStats;
use super::pool_tune::{PerModelChoice, PoolTuning};
use super::tune::{Setting, Tried};
use super::SLO_TARGET;

fn money(micros: u64) -> String {
    format!("{}.{:04}", micros / 1_000_000, (micros % 1_000_000) / 100)
}

fn setting(s: &Setting) -> String {
    format!(
        "stable window {} s ({:?}), scale-down delay {} s, zero after {} s, decoding weight {} %",
        s.stable_window_s,
        s.stable_aggregate,
        s.scale_down_delay_s,
        s.scale_to_zero_after_s,
        s.decoding_weight_percent
    )
}

fn tried(t: &Tried) -> String {
    format!(
        "{} — {}, {:.2}% SLO",
        setting(&t.setting),
        money(t.cost_micros),
        t.slo_attainment * 100.0
    )
}

fn stats(what: &str, s: &PoolStats) -> String {
    format!(
        "{what}: {} loads ({} from the node cache), {} evictions, {} idle unloads, {:.2} worker-hours with nothing loaded (pool overhead)\n",
        s.loads, s.cached_loads, s.evictions, s.idle_unloads, s.overhead_ms as f64 / 3_600_000.0
    )
}

fn tuning(t: &PoolTuning, names: &[String]) -> String {
    let target = t.slo_target * 100.0;
    let mut out = format!(
        "\nsearch: {} settings of the time constants per strategy, attainment over every request, one sample (in-sample: check it on other seeds)\n",
        t.tried
    );
    match (&t.pool, t.pool_frontier.last()) {
        (Some(b), _) => out.push_str(&format!("pool-tuned workers: {}\n", tried(b))),
        (None, Some(m)) => out.push_str(&format!(
            "pool-tuned workers: no setting reaches {target:.0}%; the row runs the one reaching the most: {}\n",
            tried(m)
        )),
        (None, None) => out.push_str("pool-tuned workers: no valid setting; the row runs the preset\n"),
    }
    match (&t.per_model_uniform, t.per_model_frontier.last()) {
        (Some(b), _) => out.push_str(&format!("per-model, one setting for all: {}\n", tried(b))),
        (None, Some(m)) => out.push_str(&format!(
            "per-model, one setting for all: none reaches {target:.0}%; the most: {}\n",
            tried(m)
        )),
        (None, None) => {}
    }
    out.push_str("per-model, each fleet its own (attainment on its own traffic):\n");
    for (name, e) in names.iter().zip(&t.per_model_each) {
        if let Some(e) = e {
            out.push_str(&format!("  {name}: {}\n", tried(e)));
        }
    }
    out.push_str(&format!(
        "per-model-tuned runs {}\n",
        match t.per_model_choice {
            PerModelChoice::Uniform => "the one setting for all",
            PerModelChoice::EachOwn => "each fleet's own setting",
        }
    ));
    let replicas: Vec<String> = names
        .iter()
        .zip(&t.always_on_replicas)
        .zip(&t.always_on_reached)
        .map(|((n, r), ok)| format!("{n} {r}{}", if *ok { "" } else { " (misses)" }))
        .collect();
    out.push_str(&format!(
        "always-on-slo replicas (smallest reaching {target:.0}% on each model's traffic): {}\n",
        replicas.join(", ")
    ));
    out.push_str(&stats("tuned pool", &t.pool_stats));
    out
}

/// The report as text.
pub fn render(r: &PoolReport, slo_s: f64) -> String {
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let mut out = format!(
        "workload: {}\nmodels: {}\npod cold start (per-model and always-on replicas, new pool workers): {:.1} s, from {}\nswap-in (pool): {:.2} s cached, {:.2} s uncached, from {}\nworker memory {:.0} GiB, model memory {:.0}-{:.0} GiB; unload after {:.0} s idle; {}\n\n",
        r.workload,
        r.models
            .iter()
            .map(|m| format!("{} {:.1}% ({} req)", m.name, m.share * 100.0, m.requests))
            .collect::<Vec<_>>()
            .join(", "),
        r.cold_start_s,
        r.cold_start_source,
        r.swap_s,
        r.swap_uncached_s,
        r.swap_source,
        gib(r.pool.spec.worker_memory_bytes),
        gib(r.pool.memory_bytes.iter().copied().min().unwrap_or(0)),
        gib(r.pool.memory_bytes.iter().copied().max().unwrap_or(0)),
        r.pool.spec.idle_unload_after.as_secs_f64(),
        if r.warm_up {
            "every strategy after one unmeasured pass of its traffic (--warm-up)"
        } else {
            "every strategy from empty: the first requests of each fleet wait its first cold start"
        },
    );
    out.push_str(&format!(
        "{:<16} {:>10} {:>10} {:>8} {:>8} {:>22} {:>9} {:>6} {:>5}\n",
        "strategy",
        "cost",
        "per Mtok",
        "rep-h",
        "od rep-h",
        "TTFT p50/90/99 s",
        format!("SLO<={slo_s}s"),
        "starts",
        "lost"
    ));
    for row in &r.rows {
        let f = row.ttft_s;
        out.push_str(&format!(
            "{:<16} {:>10} {:>10} {:>8.2} {:>8.2} {:>22} {:>8.2}% {:>6} {:>5}\n",
            row.name,
            money(row.cost_micros),
            money(row.cost_per_million_tokens_micros),
            row.spot_replica_hours + row.on_demand_replica_hours,
            row.on_demand_replica_hours,
            format!("{:.2}/{:.2}/{:.2}", f.p50, f.p90, f.p99),
            row.slo_attainment * 100.0,
            row.cold_starts,
            row.lost,
        ));
    }
    out.push('\n');
    out.push_str(&stats("pool", &r.pool_stats));
    if let Some(t) = &r.tuning {
        let names: Vec<String> = r.models.iter().map(|m| m.name.clone()).collect();
        out.push_str(&tuning(t, &names));
    }
    out.push_str(&format!(
        "\ntarget (pool >= 2x cheaper than per-model, both >= {}% SLO): {} — {} costs {:.2}x {} ({:.2}x its replica-hours){}\n",
        SLO_TARGET * 100.0,
        if r.target_met { "MET" } else { "NOT MET" },
        r.compared.1,
        r.per_model_over_pool,
        r.compared.0,
        r.per_model_over_pool_replica_hours,
        if r.tuning.is_none() && !r.target_met {
            "; --tune searches each strategy's cheapest setting reaching the SLO"
        } else {
            ""
        },
    ));
    out
}
