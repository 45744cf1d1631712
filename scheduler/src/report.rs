//! Summaries of simulations: the paper's Table 5, a per-job CSV and a utilisation SVG
//! (the paper's Fig. 14), all plain text.

use std::fmt::Write as _;

use serde::Serialize;

use crate::sim::SimResult;

/// One row of Table 5.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub scheduler: String,
    pub avg_jct_min: f64,
    /// Average JCT of `no-dw-tuned` over this scheduler's.
    pub jct_gain: f64,
    pub avg_queue_min: f64,
}

/// Table 5 rows for `results`, gains relative to `baseline` (normally `no-dw-tuned`).
pub fn summarize(results: &[SimResult], baseline: &SimResult) -> Vec<Summary> {
    let base = baseline.avg_jct_min();
    results
        .iter()
        .map(|r| {
            let jct = r.avg_jct_min();
            Summary {
                scheduler: r.scheduler.to_owned(),
                avg_jct_min: jct,
                jct_gain: if jct > 0.0 { base / jct } else { 0.0 },
                avg_queue_min: r.avg_queue_min(),
            }
        })
        .collect()
}

/// The rows as an aligned text table.
pub fn table(rows: &[Summary]) -> String {
    let mut s = format!(
        "{:<12} {:>16} {:>9} {:>18}\n",
        "scheduler", "avg JCT (min)", "JCT gain", "avg queuing (min)"
    );
    for r in rows {
        // Writing to a String cannot fail.
        let _ = writeln!(
            s,
            "{:<12} {:>16.1} {:>8.2}x {:>18.1}",
            r.scheduler, r.avg_jct_min, r.jct_gain, r.avg_queue_min
        );
    }
    s
}

/// Per-job results of several schedulers as one CSV.
pub fn jobs_csv(results: &[SimResult]) -> String {
    let mut s = String::from(
        "scheduler,job,model,gpus,cpu_intensive,data_workers,arrival_s,start_s,finish_s,queue_s,jct_s,ideal_s\n",
    );
    for r in results {
        for j in &r.jobs {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1}",
                r.scheduler,
                j.job.0,
                j.model,
                j.gpus,
                j.cpu_intensive,
                j.data_workers,
                j.arrival_s,
                j.start_s,
                j.finish_s,
                j.queue_s,
                j.jct_s,
                j.ideal_s
            );
        }
    }
    s
}

/// GPU and CPU utilisation over time, one panel per scheduler, as a standalone SVG.
pub fn utilisation_svg(results: &[SimResult]) -> String {
    const W: f64 = 900.0;
    const PANEL: f64 = 150.0;
    const LEFT: f64 = 60.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 40.0;
    const GAP: f64 = 40.0;
    let end = results
        .iter()
        .flat_map(|r| r.timeline.iter().map(|s| s.t_s))
        .fold(1.0, f64::max);
    let height = TOP + (PANEL + GAP) * results.len().max(1) as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="20" font-size="14">Cluster utilisation over time (GPU busy: blue, CPU allocated: orange)</text>"#
    );
    let plot_w = W - LEFT - RIGHT;
    for (n, r) in results.iter().enumerate() {
        let y0 = TOP + (PANEL + GAP) * n as f64;
        let x = |t: f64| LEFT + plot_w * t / end;
        let y = |u: f64| y0 + PANEL * (1.0 - u.clamp(0.0, 1.0));
        let _ = writeln!(
            s,
            r#"<rect x="{LEFT}" y="{y0}" width="{plot_w}" height="{PANEL}" fill="none" stroke="gray"/>"#
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{}</text>"#,
            LEFT + 5.0,
            y0 + 14.0,
            r.scheduler
        );
        for (label, u) in [("100%", 1.0), ("50%", 0.5), ("0%", 0.0)] {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{label}</text>"#,
                LEFT - 5.0,
                y(u) + 4.0
            );
        }
        for (colour, pick) in [
            (
                "#1f77b4",
                (|u: &crate::sim::UtilSample| u.gpu_busy) as fn(&_) -> f64,
            ),
            ("#ff7f0e", |u: &crate::sim::UtilSample| u.cpu_alloc),
        ] {
            let mut points = String::new();
            let mut last: Option<f64> = None;
            for sample in &r.timeline {
                let v = pick(sample);
                // Step function: hold the previous value until this event.
                if let Some(prev) = last {
                    let _ = write!(points, "{:.1},{:.1} ", x(sample.t_s), y(prev));
                }
                let _ = write!(points, "{:.1},{:.1} ", x(sample.t_s), y(v));
                last = Some(v);
            }
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="1" points="{}"/>"#,
                points.trim_end()
            );
        }
        let hours = end / 3600.0;
        let step = if hours > 12.0 { 4.0 } else { 1.0 };
        let mut h = 0.0;
        while h <= hours + 1e-9 {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{h}h</text>"#,
                x(h * 3600.0),
                y0 + PANEL + 14.0
            );
            h += step;
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{simulate, SchedulerKind, SimConfig};
    use crate::trace::Trace;

    fn two() -> Vec<SimResult> {
        let trace = Trace::parse_csv("0,0,1,3000,alexnet\n1,60,2,3000,bert\n").expect("valid");
        [
            SchedulerKind::NoDwTuned,
            SchedulerKind::Lode(crate::Policy::Srtf),
        ]
        .iter()
        .map(|k| simulate(&trace, *k, &SimConfig::default()).expect("runs"))
        .collect()
    }

    #[test]
    fn table_has_a_row_per_scheduler_and_gain_one_for_the_baseline() {
        let results = two();
        let rows = summarize(&results, &results[0]);
        assert_eq!(rows.len(), 2);
        assert!((rows[0].jct_gain - 1.0).abs() < 1e-12);
        let text = table(&rows);
        assert!(text.contains("no-dw-tuned") && text.contains("srtf"));
        let json = serde_json::to_value(&rows).expect("serialises");
        assert!(json[0].get("avg_jct_min").is_some() && json[0].get("jct_gain").is_some());
    }

    #[test]
    fn csv_and_svg_are_well_formed() {
        let results = two();
        let csv = jobs_csv(&results);
        assert_eq!(csv.lines().count(), 1 + 4);
        assert!(csv.lines().all(|l| l.split(',').count() == 12));
        let svg = utilisation_svg(&results);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 4);
    }
}
