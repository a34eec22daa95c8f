//! The acquire-latency CDF of every scenario in one SVG picture, time on a log scale.

use std::fmt::Write as _;

use super::stats::Outcome;

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 50.0;
/// One per scenario with latency samples (14), so that no two curves share a color.
const COLORS: [&str; 15] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#000000", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5",
];
/// Points per curve; more do not show at this size.
const POINTS: usize = 400;

/// Renders the CDFs of the outcomes that have samples.
pub fn svg(outcomes: &[Outcome]) -> String {
    let curves: Vec<&Outcome> = outcomes.iter().filter(|o| o.samples.len() > 0).collect();
    let lo = curves
        .iter()
        .filter_map(|o| o.samples.0.first())
        .min()
        .copied()
        .unwrap_or(1_000)
        .max(1_000) as f64
        / 1000.0;
    let hi = curves
        .iter()
        .filter_map(|o| o.samples.0.last())
        .max()
        .copied()
        .unwrap_or(1_000_000) as f64
        / 1000.0;
    let (lo_decade, hi_decade) = (
        lo.log10().floor(),
        hi.log10().ceil().max(lo.log10().floor() + 1.0),
    );
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |us: f64| LEFT + (us.max(1e-3).log10() - lo_decade) / (hi_decade - lo_decade) * plot_w;
    let y = |p: f64| TOP + (1.0 - p) * plot_h;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="18" text-anchor="middle" font-size="14">leasehold bench: acquire latency (CDF)</text>"#,
        LEFT + plot_w / 2.0
    );
    // Axes and grid.
    let mut decade = lo_decade;
    while decade <= hi_decade {
        let us = 10f64.powf(decade);
        let gx = x(us);
        let _ = writeln!(
            out,
            r##"<line x1="{gx:.1}" y1="{TOP}" x2="{gx:.1}" y2="{:.1}" stroke="#ddd"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 16.0,
            label(us)
        );
        decade += 1.0;
    }
    for p in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let gy = y(p);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{p}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            gy + 4.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">acquire latency (log scale)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 10.0
    );
    // Curves and legend.
    for (i, outcome) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let samples = &outcome.samples.0;
        let n = samples.len();
        let step = (n / POINTS).max(1);
        let mut points = String::new();
        for (k, &ns) in samples
            .iter()
            .enumerate()
            .step_by(step)
            .chain(std::iter::once((n - 1, &samples[n - 1])))
        {
            let p = (k + 1) as f64 / n as f64;
            let _ = write!(points, "{:.1},{:.1} ", x(ns as f64 / 1000.0), y(p));
        }
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{points}"/>"#
        );
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = LEFT + plot_w + 16.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 22.0,
            lx + 28.0,
            ly + 4.0,
            outcome.scenario
        );
    }
    let _ = writeln!(out, "</svg>");
    out
}

fn label(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{}s", us / 1_000_000.0)
    } else if us >= 1000.0 {
        format!("{}ms", us / 1000.0)
    } else {
        format!("{us}µs")
    }
}
