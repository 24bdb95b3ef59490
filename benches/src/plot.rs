//! `--plot FILE.svg`: one percentile panel per latency test of the run (every size it ran, on a
//! log "nines" axis as HdrHistogram's plotter draws them: 0 %, 90 %, 99 %, 99.9 %, ... of the
//! calls took at most this long), and, for a size sweep, the size panel: the median round trip
//! (or the average bandwidth) against size, raw verbs and RPC side by side in one chart.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::cli::TestKind;
use crate::results::{LatencyMeasure, Measure, RunReport};

/// Width and height of one panel, in pixels.
const PANEL: (u32, u32) = (860, 520);

/// Width of the percentile panels' legend margin, in pixels.
const LEGEND_W: u32 = 110;

/// Draws `report` to `path` as SVG.
///
/// # Errors
/// A message naming the file and what failed.
pub fn draw(report: &RunReport, path: &Path) -> Result<(), String> {
    draw_lines(report, path, None).map_err(|e| format!("--plot {}: {e}", path.display()))
}

/// Draws one latency distribution (percentiles of `rec`) labelled `label` to `path` as SVG,
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
        measure: Measure::Latency(LatencyMeasure { summary, cdf: rec.cdf() }),
    });
    draw_lines(&report, path, Some(label)).map_err(|e| format!("--plot {}: {e}", path.display()))
}

/// The x of a fraction `f` of the calls on the nines axis: `1 / (1 - f)` (1 at 0 %, 10 at 90 %,
/// 100 at 99 %, ...), capped at `cap` (the last sample's fraction is 1).
fn nines_x(f: f64, cap: f64) -> f64 {
    if f >= 1.0 {
        cap
    } else {
        (1.0 / (1.0 - f)).min(cap)
    }
}

/// The label of `x` on the nines axis: `1 / (1 - f)` back to a percentile ("99.9%").
fn nines_label(x: f64) -> String {
    let nines = x.log10().round() as i32;
    match nines {
        n if n <= 0 => "0%".to_owned(),
        1 => "90%".to_owned(),
        n => format!("99.{}%", "9".repeat((n - 2) as usize)).replace("99.%", "99%"),
    }
}

/// The latency results of the run, grouped by test in the order first run.
fn latency_by_test(report: &RunReport) -> Vec<(TestKind, Vec<(usize, &LatencyMeasure)>)> {
    let mut out: Vec<(TestKind, Vec<(usize, &LatencyMeasure)>)> = Vec::new();
    for r in &report.results {
        let Measure::Latency(m) = &r.measure else { continue };
        if m.cdf.is_empty() {
            continue;
        }
        match out.iter_mut().find(|(t, _)| *t == r.test) {
            Some((_, v)) => v.push((r.bytes, m)),
            None => out.push((r.test, vec![(r.bytes, m)])),
        }
    }
    out
}

fn draw_lines(
    report: &RunReport,
    path: &Path,
    label: Option<&str>,
) -> Result<(), Box<dyn std::error::Error>> {
    let by_test = latency_by_test(report);
    let sweep = report.results.iter().map(|r| r.bytes).collect::<std::collections::BTreeSet<_>>().len() > 1;
    let panels = by_test.len() + usize::from(sweep);
    let cols = panels.clamp(1, 2);
    let rows = panels.div_ceil(cols).max(1);
    let root = SVGBackend::new(path, (PANEL.0 * cols as u32, PANEL.1 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((rows, cols));
    for (i, (test, lines)) in by_test.iter().enumerate() {
        percentiles(&areas[i], &report.transport, *test, lines, label)?;
    }
    if sweep {
        sizes(&areas[by_test.len()], report)?;
    }
    root.present()?;
    Ok(())
}

/// One test's percentile panel: a line per size.
fn percentiles(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    transport: &str,
    test: TestKind,
    lines: &[(usize, &LatencyMeasure)],
    label: Option<&str>,
) -> Result<(), Box<dyn std::error::Error>> {
    // The axis ends at the nines the largest sample count resolves (10 samples past the last).
    let samples = lines.iter().map(|(_, m)| m.summary.iterations).max().unwrap_or(1).max(10) as f64;
    let cap = 10f64.powf((samples / 10.0).log10().floor().max(1.0));
    let us = |ns: f64| ns / 1000.0;
    let y_max = lines.iter().map(|(_, m)| us(m.summary.max_ns)).fold(0.0, f64::max).max(1e-3);
    let y_min = lines.iter().map(|(_, m)| us(m.summary.min_ns)).fold(f64::MAX, f64::min).max(1e-3);
    let log_y = y_max / y_min > 20.0;
    let title = format!("{} round trip by percentile ({transport})", test.name());
    let mut chart = ChartBuilder::on(area);
    // The legend goes right of the plot, in a margin of its own (it would hide lines inside).
    chart
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .margin_right(LEGEND_W)
        .x_label_area_size(45)
        .y_label_area_size(65);
    let x_range = (1f64..cap).log_scale();
    let series = |m: &LatencyMeasure| -> Vec<(f64, f64)> {
        m.cdf.iter().map(|&(ns, f)| (nines_x(f, cap), us(ns))).collect()
    };
    let name = |bytes: usize| label.map_or_else(|| format!("{} B", bytes), str::to_owned);
    macro_rules! draw_chart {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc("percentile (log nines)")
                .y_desc("round trip [usec]")
                .x_label_formatter(&|x| nines_label(*x))
                .draw()?;
            for (i, (_, m)) in lines.iter().enumerate() {
                chart
                    .draw_series(LineSeries::new(series(m), Palette99::pick(i).to_rgba().stroke_width(2)))?;
            }
        }};
    }
    if log_y {
        draw_chart!(chart.build_cartesian_2d(x_range, (y_min * 0.8..y_max * 1.25).log_scale())?);
    } else {
        draw_chart!(chart.build_cartesian_2d(x_range, 0f64..y_max * 1.05)?);
    }
    // The legend, in the panel's right margin: a swatch and the size per line.
    let x0 = (area.dim_in_pixel().0 - LEGEND_W + 10) as i32;
    for (i, (bytes, _)) in lines.iter().enumerate() {
        let y = 48 + 15 * i as i32;
        let color = Palette99::pick(i).to_rgba();
        area.draw(&PathElement::new(vec![(x0, y), (x0 + 18, y)], color.stroke_width(3)))?;
        area.draw(&Text::new(name(*bytes), (x0 + 24, y - 6), ("sans-serif", 12)))?;
    }
    Ok(())
}

/// The size panel of a sweep: p50 round trip (latency tests) or average bandwidth against size,
/// every test of the run in one chart (raw verbs dashed, RPC solid).
fn sizes(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    report: &RunReport,
) -> Result<(), Box<dyn std::error::Error>> {
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
    let pts: Vec<(TestKind, f64, f64)> =
        report.results.iter().filter_map(|r| Some((r.test, r.bytes as f64, value(&r.measure)?))).collect();
    let x_max = pts.iter().map(|p| p.1).fold(2.0, f64::max);
    let y_max = pts.iter().map(|p| p.2).fold(0.0, f64::max) * 1.5;
    let y_min = (pts.iter().map(|p| p.2).fold(f64::MAX, f64::min) * 0.5).max(1e-6);
    let mut chart = ChartBuilder::on(area)
        .caption(
            if any_lat {
                "Median round trip vs size: raw and RPC"
            } else {
                "Average bandwidth vs size: raw and RPC"
            },
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d((1f64..x_max * 1.5).log_scale(), (y_min..y_max.max(y_min * 10.0)).log_scale())?;
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
        let style = color.stroke_width(2);
        let name = if t.is_rpc() { t.name().to_owned() } else { format!("{} (raw)", t.name()) };
        if t.is_rpc() {
            chart.draw_series(LineSeries::new(series.clone(), style))?;
        } else {
            chart.draw_series(DashedLineSeries::new(series.clone(), 6, 4, style))?;
        }
        chart
            .draw_series(series.iter().map(|&(x, y)| Circle::new((x, y), 3, color.filled())))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
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
        // A percentile panel per test, every size in it, on the nines axis.
        assert!(svg.contains("send_lat round trip by percentile"));
        assert!(svg.contains("rpc_lat round trip by percentile"));
        // (plotters writes a text's content on a line of its own.)
        let texts: Vec<&str> = svg.lines().map(str::trim).collect();
        assert_eq!(texts.iter().filter(|t| **t == "8 B").count(), 2, "each test's panel has its 8 B line");
        // 1,000 samples: the axis resolves 0 %, 90 % and 99 %, once per panel.
        assert_eq!(texts.iter().filter(|t| **t == "99%").count(), 2, "nines axis labels");
        // The size panel: raw and RPC in one chart.
        assert!(svg.contains("Median round trip vs size: raw and RPC"));
        assert!(svg.contains("send_lat (raw)"));
        assert!(svg.contains("<polyline"));
    }

    #[test]
    fn the_nines_axis_maps_percentiles_to_decades() {
        assert_eq!(nines_x(0.0, 1e4), 1.0);
        assert!((nines_x(0.9, 1e4) - 10.0).abs() < 1e-9);
        assert!((nines_x(0.999, 1e4) - 1000.0).abs() < 1e-6);
        assert_eq!(nines_x(1.0, 1e4), 1e4);
        let labels: Vec<String> = [1.0, 10.0, 100.0, 1000.0, 10000.0].into_iter().map(nines_label).collect();
        assert_eq!(labels, ["0%", "90%", "99%", "99.9%", "99.99%"]);
    }

    #[test]
    fn unwritable_path_is_named() {
        let r = RunReport::new("sim", "sim0");
        let e = draw(&r, Path::new("/nonexistent-dir/x.svg")).unwrap_err();
        assert!(e.starts_with("--plot /nonexistent-dir/x.svg:"), "{e}");
    }
}
