//! Throughput over time as SVG: one panel per workload (every contender's median run) and one
//! for the sustained runs.

use std::path::Path;

use plotters::prelude::*;

use crate::measure::Sample;

/// A named line: (seconds, messages per second).
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Messages per second between consecutive samples, averaged over `smooth` samples.
pub fn rate_points(series: &[Sample], smooth: usize) -> Vec<(f64, f64)> {
    let step = smooth.max(1);
    series
        .windows(step + 1)
        .step_by(step)
        .filter_map(|w| {
            let (a, b) = (w.first()?, w.last()?);
            let dt = b.t - a.t;
            (dt > 0.0).then(|| (b.t, (b.count - a.count) as f64 / dt))
        })
        .collect()
}

/// Draws one panel per (title, lines) stacked vertically: messages per second over time.
pub fn draw(path: &Path, panels: &[(String, Vec<Line>)]) -> anyhow::Result<()> {
    let panels: Vec<Panel<'_>> = panels
        .iter()
        .map(|(title, lines)| Panel {
            title,
            x_desc: "seconds",
            y_desc: "messages/s",
            lines,
        })
        .collect();
    draw_panels(path, &panels)
}

/// One chart: its title, its axes' names and its lines.
pub struct Panel<'a> {
    pub title: &'a str,
    pub x_desc: &'a str,
    pub y_desc: &'a str,
    pub lines: &'a [Line],
}

/// Draws the panels stacked vertically, each from 0 to a little above its highest point.
pub fn draw_panels(path: &Path, panels: &[Panel<'_>]) -> anyhow::Result<()> {
    if panels.is_empty() {
        return Ok(());
    }
    let height = 360 * panels.len() as u32;
    let root = SVGBackend::new(path, (960, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((panels.len(), 1));
    for (panel, area) in panels.iter().zip(areas) {
        let lines = panel.lines;
        let max_t = lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.0))
            .fold(1.0, f64::max);
        let max_rate = lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.1))
            .fold(1.0, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(&area)
            .caption(panel.title, ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..max_t, 0.0..max_rate)?;
        chart
            .configure_mesh()
            .x_desc(panel.x_desc)
            .y_desc(panel.y_desc)
            .draw()?;
        for (index, line) in lines.iter().enumerate() {
            let color = Palette99::pick(index).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    line.points.iter().copied(),
                    color.stroke_width(2),
                ))?
                .label(line.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
