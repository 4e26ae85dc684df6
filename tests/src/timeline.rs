//! The replicas/backlog timeline of an autoscaling run, recorded while it runs and drawn as an
//! SVG: pods on top (what the operator asked for and what runs), backlog below.

use std::path::Path;

use plotters::prelude::*;

use crate::pods::PodCountSample;

/// The backlog at one moment, on the test cluster's clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BacklogSample {
    pub at: f64,
    /// Pending rows counted in the table by the test.
    pub pending: i64,
    /// The backlog in the OutboxRelay's status: what the operator scaled on.
    pub reported: Option<i64>,
}

/// Turns change points into a step line that holds each value until the next change.
fn steps(points: &[(f64, f64)], end: f64) -> Vec<(f64, f64)> {
    let mut line = Vec::with_capacity(points.len() * 2 + 1);
    for (index, &(at, value)) in points.iter().enumerate() {
        if let Some(&(_, previous)) = index.checked_sub(1).and_then(|i| points.get(i)) {
            line.push((at, previous));
        }
        line.push((at, value));
    }
    if let Some(&(at, value)) = points.last()
        && end > at
    {
        line.push((end, value));
    }
    line
}

/// Draws the run to `path` (SVG), creating its folder.
pub fn draw(
    path: &Path,
    title: &str,
    replicas: &[(f64, i32)],
    pods: &[PodCountSample],
    backlog: &[BacklogSample],
) -> anyhow::Result<()> {
    if let Some(folder) = path.parent() {
        std::fs::create_dir_all(folder)?;
    }
    let times = || {
        pods.iter()
            .map(|s| s.at)
            .chain(replicas.iter().map(|r| r.0))
            .chain(backlog.iter().map(|s| s.at))
    };
    let end = times().fold(1.0, f64::max);
    let start = times().fold(end, f64::min);
    let asked = steps(
        &replicas
            .iter()
            .map(|(at, r)| (*at, f64::from(*r)))
            .collect::<Vec<_>>(),
        end,
    );
    let running = steps(
        &pods
            .iter()
            .map(|s| (s.at, s.running as f64))
            .collect::<Vec<_>>(),
        end,
    );
    let max_pods = asked
        .iter()
        .chain(&running)
        .map(|p| p.1)
        .fold(1.0, f64::max)
        + 1.0;
    let max_backlog = backlog
        .iter()
        .map(|s| s.pending.max(s.reported.unwrap_or(0)) as f64)
        .fold(1.0, f64::max)
        * 1.1;

    let root = SVGBackend::new(path, (960, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 22))?;
    let (top, bottom) = root.split_vertically(300);

    let mut chart = ChartBuilder::on(&top)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(start..end, 0.0..max_pods)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("pods")
        .draw()?;
    // The two pod lines mostly coincide: the spec is drawn wide and pale, the processes
    // dashed on top, so both stay visible.
    let spec_style = BLUE.mix(0.4).stroke_width(6);
    chart
        .draw_series(LineSeries::new(asked.iter().copied(), spec_style))?
        .label("replicas (Deployment spec)")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], spec_style));
    let running_style = GREEN.mix(0.9).stroke_width(2);
    chart
        .draw_series(DashedLineSeries::new(
            running.iter().copied(),
            8,
            5,
            running_style,
        ))?
        .label("relay processes running")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], running_style));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;

    let mut chart = ChartBuilder::on(&bottom)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(start..end, 0.0..max_backlog)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("pending rows")
        .draw()?;
    let pending: Vec<(f64, f64)> = backlog.iter().map(|s| (s.at, s.pending as f64)).collect();
    let reported: Vec<(f64, f64)> = backlog
        .iter()
        .filter_map(|s| Some((s.at, s.reported? as f64)))
        .collect();
    for (label, points, color) in [
        ("pending rows (table)", &pending, RED),
        ("backlog in status (operator)", &reported, MAGENTA),
    ] {
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_hold_each_value_until_the_next_change() {
        let line = steps(&[(0.0, 1.0), (2.0, 3.0)], 5.0);
        assert_eq!(line, vec![(0.0, 1.0), (2.0, 1.0), (2.0, 3.0), (5.0, 3.0)]);
    }
}
