//! `--plot FILE.svg`: the round-trip latency distribution (CDF, up to p99.9) of each latency
//! result and, for a size sweep, the median round trip (or average bandwidth) against size.

use std::path::Path;

use plotters::prelude::*;

use crate::cli::TestKind;
use crate::results::{Measure, RunReport};

/// Most CDF lines drawn; beyond that only the smallest size of each test is drawn.
const MAX_CDF_LINES: usize = 8;

/// Draws `report` to `path` as SVG.
///
/// # Errors
/// A message naming the file and what failed.
pub fn draw(report: &RunReport, path: &Path) -> Result<(), String> {
    draw_inner(report, path).map_err(|e| format!("--plot {}: {e}", path.display()))
}

/// Draws one latency distribution (CDF of `rec`, up to p99.9) labelled `label` to `path` as SVG,
/// titled `title` (`rpc-perf bench --plot`).
///
/// # Errors
/// A message naming the file and what failed (also when `rec` is empty).
pub fn draw_cdf(
    path: &Path,
    title: &str,
    label: &str,
    rec: &crate::stats::LatencyRecorder,
) -> Result<(), String> {
    let Some(summary) = rec.summary() else {
        return Err(format!("--plot {}: no call answered OK, nothing to draw", path.display()));
    };
    let mut report = RunReport::new(title, "");
    report.results.push(crate::results::TestResult {
        test: TestKind::RpcLat,
        bytes: 0,
        req_bytes: 0,
        resp_bytes: 0,
        concurrency: 0,
        measure: Measure::Latency(crate::results::LatencyMeasure { summary, cdf: rec.cdf() }),
    });
    draw_labelled(&report, path, Some(label))
}

fn draw_inner(report: &RunReport, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    draw_lines(report, path, None)
}

fn draw_labelled(report: &RunReport, path: &Path, label: Option<&str>) -> Result<(), String> {
    draw_lines(report, path, label).map_err(|e| format!("--plot {}: {e}", path.display()))
}

fn draw_lines(
    report: &RunReport,
    path: &Path,
    label: Option<&str>,
) -> Result<(), Box<dyn std::error::Error>> {
    let lat: Vec<_> = report
        .results
        .iter()
        .filter_map(|r| match &r.measure {
            Measure::Latency(m) if !m.cdf.is_empty() => Some((r, m)),
            _ => None,
        })
        .collect();
    let mut cdfs = lat.clone();
    if cdfs.len() > MAX_CDF_LINES {
        cdfs.retain(|(r, _)| !lat.iter().any(|(o, _)| o.test == r.test && o.bytes < r.bytes));
    }
    let sweep = report.results.iter().map(|r| r.bytes).collect::<std::collections::BTreeSet<_>>().len() > 1;

    let root = SVGBackend::new(path, if sweep { (1400, 560) } else { (800, 560) }).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = if sweep { root.split_horizontally(700) } else { (root.clone(), root.clone()) };

    if !cdfs.is_empty() {
        let x_max = cdfs.iter().map(|(_, m)| m.summary.p99_9_ns / 1000.0).fold(0.0, f64::max) * 1.05;
        let x_min = cdfs.iter().map(|(_, m)| m.summary.min_ns / 1000.0).fold(f64::MAX, f64::min) * 0.95;
        let mut chart = ChartBuilder::on(&left)
            .caption(format!("Round-trip latency CDF ({}, to p99.9)", report.transport), ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(x_min..x_max.max(x_min + 0.01), 0f64..1f64)?;
        chart.configure_mesh().x_desc("round trip [usec]").y_desc("fraction of calls").draw()?;
        for (i, (r, m)) in cdfs.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let pts = m.cdf.iter().map(|&(ns, f)| (ns / 1000.0, f)).filter(|&(x, _)| x <= x_max);
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
                .label(label.map_or_else(|| format!("{} {} B", r.test.name(), r.bytes), str::to_owned))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }

    if sweep {
        let tests: Vec<TestKind> = {
            let mut t: Vec<_> = report.results.iter().map(|r| r.test).collect();
            t.dedup();
            t
        };
        let any_lat = tests.iter().any(|t| t.is_latency());
        let value = |m: &Measure| match m {
            Measure::Latency(l) if any_lat => Some(l.summary.typical_ns / 1000.0),
            Measure::Bandwidth(b) if !any_lat => Some(b.avg_mb_per_s),
            _ => None,
        };
        let pts: Vec<(TestKind, f64, f64)> = report
            .results
            .iter()
            .filter_map(|r| Some((r.test, r.bytes as f64, value(&r.measure)?)))
            .collect();
        let x_max = pts.iter().map(|p| p.1).fold(2.0, f64::max);
        let y_max = pts.iter().map(|p| p.2).fold(0.0, f64::max) * 1.5;
        let y_min = (pts.iter().map(|p| p.2).fold(f64::MAX, f64::min) * 0.5).max(1e-6);
        let mut chart = ChartBuilder::on(&right)
            .caption(
                if any_lat { "Median round trip vs size" } else { "Average bandwidth vs size" },
                ("sans-serif", 20),
            )
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d(
                (1f64..x_max * 1.5).log_scale(),
                (y_min..y_max.max(y_min * 10.0)).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_desc("message size [bytes]")
            .y_desc(if any_lat { "p50 round trip [usec]" } else { "BW average [MB/sec]" })
            .draw()?;
        for (i, t) in tests.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let series: Vec<(f64, f64)> = pts.iter().filter(|p| p.0 == *t).map(|p| (p.1, p.2)).collect();
            if series.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(series, color.stroke_width(2)))?
                .label(t.name())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{LatencyMeasure, TestResult};
    use crate::stats::LatencyRecorder;

    fn lat(test: TestKind, bytes: usize, base: u64) -> TestResult {
        let mut rec = LatencyRecorder::new();
        for i in 0..1000 {
            rec.record(base + i);
        }
        TestResult {
            test,
            bytes,
            req_bytes: bytes,
            resp_bytes: bytes,
            concurrency: 1,
            measure: Measure::Latency(LatencyMeasure { summary: rec.summary().unwrap(), cdf: rec.cdf() }),
        }
    }

    #[test]
    fn draws_cdf_and_sweep() {
        let mut r = RunReport::new("sim", "sim0");
        for (i, b) in [2usize, 4, 8].into_iter().enumerate() {
            r.results.push(lat(TestKind::SendLat, b, 500 + 10 * i as u64));
            r.results.push(lat(TestKind::RpcLat, b, 800 + 10 * i as u64));
        }
        let path = std::env::temp_dir().join(format!("rpc-perf-plot-{}.svg", std::process::id()));
        draw(&r, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains("Round-trip latency CDF"));
        assert!(svg.contains("send_lat 2 B"));
        assert!(svg.contains("rpc_lat 8 B"));
        assert!(svg.contains("Median round trip vs size"));
        assert!(svg.contains("<polyline"));
    }

    #[test]
    fn unwritable_path_is_named() {
        let r = RunReport::new("sim", "sim0");
        let e = draw(&r, Path::new("/nonexistent-dir/x.svg")).unwrap_err();
        assert!(e.starts_with("--plot /nonexistent-dir/x.svg:"), "{e}");
    }
}
