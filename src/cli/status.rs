//! `tidal status`: models, workers, backlog and this month's usage of a running `tidal up`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::Value;

/// Flags of `tidal status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The `tidal up` to ask.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Admin token (default: the one `tidal up` saved in its data directory).
    #[arg(long, env = "TIDAL_ADMIN_TOKEN")]
    pub admin_token: Option<String>,
    /// Data directory of that `tidal up` (default: $TIDAL_DATA_DIR, else ~/.local/share/tidal).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Print the raw JSON.
    #[arg(long)]
    pub json: bool,
}

/// Prints the status.
pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let token = match args.admin_token {
        Some(t) => t,
        None => {
            let dir = args
                .data_dir
                .unwrap_or_else(tidal_local::paths::default_data_dir);
            tidal_local::credentials::load(&dir)?
                .with_context(|| format!("no credentials in {} (is `tidal up` using another --data-dir?); pass --admin-token", dir.display()))?
                .admin_token
        }
    };
    let url = format!("{}/local/status", args.url.trim_end_matches('/'));
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    let body: Value = runtime.block_on(async {
        let response = reqwest::Client::new()
            .get(&url)
            .bearer_auth(&token)
            .send()
            .await
            .with_context(|| format!("asking {url} (is `tidal up` running?)"))?;
        let status = response.status();
        let body: Value = response.json().await.context("reading the status")?;
        if !status.is_success() {
            bail!("{url}: {status}: {}", body["error"]["message"]);
        }
        anyhow::Ok(body)
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    print!("{}", render(&body));
    Ok(())
}

/// A JSON count as a number (JSON values ignore format widths).
fn count(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The status as two plain-text tables.
fn render(body: &Value) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<28} {:<15} {:>5} {:>8} {:>7} {:>7} {:>8} {:>9} {:>11}  {}\n",
        "MODEL",
        "STATE",
        "READY",
        "STARTING",
        "DESIRED",
        "BACKLOG",
        "IN FLIGHT",
        "COLD STARTS",
        "LAST COLD",
        "WHY"
    ));
    for m in body["models"].as_array().into_iter().flatten() {
        let cold = m["last_cold_start_ms"]
            .as_u64()
            .map(|ms| format!("{:.2}s", ms as f64 / 1000.0))
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:<28} {:<15} {:>5} {:>8} {:>7} {:>7} {:>8} {:>9} {:>11}  {}\n",
            m["id"].as_str().unwrap_or_default(),
            m["state"].as_str().unwrap_or_default(),
            count(&m["ready"]),
            count(&m["starting"]),
            count(&m["desired"]),
            count(&m["backlog"]),
            count(&m["in_flight"]),
            count(&m["cold_starts"]),
            cold,
            m["reason"].as_str().unwrap_or("-")
        ));
    }
    let rows = body["usage"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    out.push_str("\nUSAGE THIS MONTH\n");
    if rows.is_empty() {
        out.push_str("  none yet\n");
        return out;
    }
    out.push_str(&format!(
        "{:<12} {:<28} {:<11} {:>10} {:>10} {:>10}\n",
        "TENANT", "MODEL", "DAY", "INPUT", "CACHED", "OUTPUT"
    ));
    for r in rows {
        out.push_str(&format!(
            "{:<12} {:<28} {:<11} {:>10} {:>10} {:>10}\n",
            r["tenant"].as_str().unwrap_or_default(),
            r["model"].as_str().unwrap_or_default(),
            r["day"].as_str().unwrap_or_default(),
            count(&r["totals"]["input_tokens"]),
            count(&r["totals"]["cached_input_tokens"]),
            count(&r["totals"]["output_tokens"]),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_models_and_usage() {
        let body = serde_json::json!({
            "models": [{"id": "smol", "state": "ready", "ready": 1, "starting": 0,
                        "desired": 1, "backlog": 2, "in_flight": 3, "cold_starts": 1,
                        "last_cold_start_ms": 1250, "reason": "scheduled-floor"}],
            "usage": [{"tenant": "local", "model": "smol", "day": "2026-11-30",
                       "totals": {"input_tokens": 10, "cached_input_tokens": 4, "output_tokens": 7}}]
        });
        let text = render(&body);
        assert!(text.contains("smol"), "{text}");
        assert!(text.contains("1.25s  scheduled-floor"), "{text}");
        assert!(
            text.lines()
                .next()
                .is_some_and(|l| l.contains("DESIRED") && l.ends_with("WHY")),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("local") && l.ends_with(" 7")),
            "{text}"
        );
        let empty = render(&serde_json::json!({"models": [], "usage": []}));
        assert!(empty.contains("none yet"));
    }
}
