//! The load-and-replicas plot, written as SVG by hand (one panel per policy).

use super::engine::Sample;
use std::fmt::Write;

const W: f64 = 1000.0;
const PANEL_H: f64 = 170.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 60.0;
const TOP: f64 = 40.0;
const GAP: f64 = 40.0;

fn polyline(points: &[(f64, f64)], style: &str) -> String {
    let mut d = String::new();
    for (x, y) in points {
        let _ = write!(d, "{x:.1},{y:.1} ");
    }
    format!(
        "<polyline fill=\"none\" {style} points=\"{}\"/>\n",
        d.trim_end()
    )
}

/// Renders one panel per `(policy, series)`: arrivals/s (grey, right axis) and ready spot,
/// ready on-demand and billed replicas (left axis) over time.
pub fn render(title: &str, panels: &[(&str, &[Sample])]) -> String {
    let t_max = panels
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.t_s))
        .fold(1.0_f64, f64::max);
    let rep_max = panels
        .iter()
        .flat_map(|(_, s)| {
            s.iter()
                .map(|p| p.billed.max(p.ready_spot + p.ready_on_demand))
        })
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let load_max = panels
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.arrivals_per_s))
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let h = TOP + panels.len() as f64 * (PANEL_H + GAP) + 20.0;
    let pw = W - LEFT - RIGHT;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">"
    );
    let _ = writeln!(out, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let _ = writeln!(
        out,
        "<text x=\"{LEFT}\" y=\"18\" font-size=\"14\">{}</text>",
        escape(title)
    );
    let _ = writeln!(
        out,
        "<text x=\"{LEFT}\" y=\"32\"><tspan fill=\"#999\">arrivals/s (right axis)</tspan>  <tspan fill=\"#1f77b4\">billed replicas</tspan>  <tspan fill=\"#2ca02c\">ready spot</tspan>  <tspan fill=\"#ff7f0e\">ready on-demand</tspan></text>"
    );
    for (k, (name, series)) in panels.iter().enumerate() {
        let y0 = TOP + k as f64 * (PANEL_H + GAP) + GAP / 2.0;
        let x = |t: f64| LEFT + t / t_max * pw;
        let yr = |v: f64| y0 + PANEL_H - v / rep_max * PANEL_H;
        let yl = |v: f64| y0 + PANEL_H - v / load_max * PANEL_H;
        let _ = writeln!(
            out,
            "<rect x=\"{LEFT}\" y=\"{y0:.1}\" width=\"{pw}\" height=\"{PANEL_H}\" fill=\"none\" stroke=\"#ccc\"/>"
        );
        let _ = writeln!(
            out,
            "<text x=\"{LEFT}\" y=\"{:.1}\" font-weight=\"bold\">{}</text>",
            y0 - 4.0,
            escape(name)
        );
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{rep_max:.0}</text>",
            LEFT - 4.0,
            y0 + 10.0
        );
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">0</text>",
            LEFT - 4.0,
            y0 + PANEL_H
        );
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\">{load_max:.1}/s</text>",
            W - RIGHT + 4.0,
            y0 + 10.0
        );
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0} min</text>",
            W - RIGHT,
            y0 + PANEL_H + 12.0,
            t_max / 60.0
        );
        let load: Vec<_> = series
            .iter()
            .map(|p| (x(p.t_s), yl(p.arrivals_per_s)))
            .collect();
        out.push_str(&polyline(&load, "stroke=\"#bbb\" stroke-width=\"1\""));
        let step = |f: &dyn Fn(&Sample) -> u32| -> Vec<(f64, f64)> {
            let mut pts = Vec::with_capacity(series.len() * 2);
            for (i, p) in series.iter().enumerate() {
                let v = f64::from(f(p));
                if i > 0 {
                    pts.push((x(p.t_s), pts.last().map_or(yr(v), |l: &(f64, f64)| l.1)));
                }
                pts.push((x(p.t_s), yr(v)));
            }
            pts
        };
        out.push_str(&polyline(
            &step(&|p| p.billed),
            "stroke=\"#1f77b4\" stroke-width=\"1.5\"",
        ));
        out.push_str(&polyline(
            &step(&|p| p.ready_spot),
            "stroke=\"#2ca02c\" stroke-width=\"1\"",
        ));
        out.push_str(&polyline(
            &step(&|p| p.ready_on_demand),
            "stroke=\"#ff7f0e\" stroke-width=\"1\"",
        ));
    }
    out.push_str("</svg>\n");
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_one_panel_per_policy_with_escaped_titles() {
        let s = [
            Sample {
                t_s: 0.0,
                arrivals_per_s: 1.0,
                ready_spot: 0,
                ready_on_demand: 0,
                billed: 1,
                backlog: 0,
                desired: 1,
                reason: None,
            },
            Sample {
                t_s: 10.0,
                arrivals_per_s: 3.0,
                ready_spot: 2,
                ready_on_demand: 1,
                billed: 3,
                backlog: 0,
                desired: 3,
                reason: Some("stable"),
            },
        ];
        let svg = render("a<b", &[("ours", &s), ("kpa", &s)]);
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("a&lt;b"));
        assert_eq!(svg.matches("font-weight=\"bold\"").count(), 2);
        assert_eq!(svg.matches("<polyline").count(), 8);
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
