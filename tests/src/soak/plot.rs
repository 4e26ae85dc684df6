//! The soak drawn as an SVG for the Reliability page: six panels over the run's minutes, each
//! with the faults marked where they started.

use std::path::Path;

use plotters::prelude::*;

use super::record::Period;
use super::verdict::FaultSpan;

/// One line of a panel: its label, colour and (minute, value) points.
type Line<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);

/// One panel: a title and its lines.
struct Panel<'a> {
    title: &'a str,
    lines: Vec<Line<'a>>,
}

fn line(periods: &[Period], value: impl Fn(&Period) -> Option<f64>) -> Vec<(f64, f64)> {
    periods
        .iter()
        .filter_map(|p| Some((p.end_s / 60.0, value(p)?)))
        .collect()
}

/// Draws `periods` to `path` (SVG), with `spans` marked, creating its folder.
pub fn draw(
    path: &Path,
    title: &str,
    periods: &[Period],
    spans: &[FaultSpan],
) -> anyhow::Result<()> {
    if let Some(folder) = path.parent() {
        std::fs::create_dir_all(folder)?;
    }
    let panels = [
        Panel {
            title: "messages per second",
            lines: vec![
                (
                    "offered",
                    BLUE,
                    line(periods, |p| Some(p.offered as f64 / p.seconds.max(1e-9))),
                ),
                ("delivered", GREEN, line(periods, |p| Some(p.throughput))),
            ],
        },
        Panel {
            title: "backlog (pending rows)",
            lines: vec![("pending", RED, line(periods, |p| Some(p.backlog as f64)))],
        },
        Panel {
            title: "end-to-end latency p99 (ms)",
            lines: vec![("p99", MAGENTA, line(periods, |p| p.latency_p99_ms))],
        },
        Panel {
            title: "memory (MiB, anonymous)",
            lines: vec![
                (
                    "relay pod (largest)",
                    BLUE,
                    line(periods, |p| p.relay_rss_mib),
                ),
                ("operator pod", BLACK, line(periods, |p| p.operator_rss_mib)),
            ],
        },
        Panel {
            title: "dead tuples",
            lines: vec![(
                "n_dead_tup",
                RED,
                line(periods, |p| Some(p.dead_tuples as f64)),
            )],
        },
        Panel {
            title: "table size (MiB, with indexes)",
            lines: vec![("table", GREEN, line(periods, |p| Some(p.table_mib)))],
        },
    ];
    let end = periods.last().map_or(1.0, |p| p.end_s / 60.0).max(1e-3);

    let root = SVGBackend::new(path, (1100, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    for (area, panel) in root.split_evenly((3, 2)).iter().zip(&panels) {
        let top = panel
            .lines
            .iter()
            .flat_map(|(_, _, points)| points.iter().map(|p| p.1))
            .fold(1.0, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(panel.title, ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(55)
            .build_cartesian_2d(0.0..end, 0.0..top)?;
        chart.configure_mesh().x_desc("minutes").draw()?;
        for span in spans {
            let at = span.start_s / 60.0;
            chart.draw_series(LineSeries::new(
                [(at, 0.0), (at, top)],
                BLACK.mix(0.3).stroke_width(1),
            ))?;
        }
        for (label, color, points) in &panel.lines {
            let style = color.stroke_width(2);
            chart
                .draw_series(LineSeries::new(points.iter().copied(), style))?
                .label(*label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
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
