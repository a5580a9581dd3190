//! Draws a simulation as SVG: one lane per algorithm with every request as admitted (green dot)
//! or refused (red cross) over time, the units admitted in the trailing window of one period
//! (blue steps) against the limit (black) and the promised bound (orange), and the busiest
//! window shaded.

use plotters::prelude::*;
use tollgate::Quota;

use super::engine::{secs, Outcome, Stream, SECOND};

/// At most this many request marks per lane; beyond it every n-th is drawn (the counts and the
/// trailing line are always exact).
const MAX_MARKS: usize = 4_000;
/// At most this many steps of the trailing-window line per lane.
const MAX_STEPS: usize = 20_000;

const LANE_HEIGHT: u32 = 190;
const WIDTH: u32 = 1_100;

/// The picture of one simulation, as an SVG document.
pub fn render(
    title: &str,
    stream: &Stream,
    quota: &Quota,
    decisions: &[Vec<bool>],
    outcomes: &[Outcome],
) -> Result<String, String> {
    let mut out = String::new();
    {
        let height = 40 + LANE_HEIGHT * outcomes.len() as u32;
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root
            .titled(title, ("sans-serif", 20))
            .map_err(|e| e.to_string())?;
        // One vertical scale for every lane, so lanes compare at a glance.
        let y_top = outcomes
            .iter()
            .map(|o| o.bound.max(o.worst.units))
            .max()
            .unwrap_or(0)
            .max(quota.count()) as f64
            + 1.0;
        let lanes = root.split_evenly((outcomes.len(), 1));
        for ((lane, outcome), admitted) in lanes.iter().zip(outcomes).zip(decisions) {
            draw_lane(lane, stream, quota, admitted, outcome, y_top).map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw_lane<'a>(
    lane: &Area<'a>,
    stream: &Stream,
    quota: &Quota,
    admitted: &[bool],
    o: &Outcome,
    y_top: f64,
) -> Result<(), Box<dyn std::error::Error + 'a>> {
    let period = quota.period_micros();
    let x_end = (stream.end + period / 20).max(1) as f64 / SECOND as f64;
    let count = quota.count() as f64;
    let mark_y = -0.08 * y_top;
    let caption = format!(
        "{}: admitted {} of {}; most in any {} window: {} within {} (promised <= {}){}",
        o.kind,
        o.admitted,
        o.offered,
        secs(period),
        o.worst.units,
        secs(o.worst.last - o.worst.first),
        o.bound,
        if stream.keys.len() > 1 {
            format!(", key {}", stream.keys[o.worst.key])
        } else {
            String::new()
        }
    );
    let mut chart = ChartBuilder::on(lane)
        .caption(caption, ("sans-serif", 14))
        .margin(6)
        .x_label_area_size(22)
        .y_label_area_size(40)
        .build_cartesian_2d(0f64..x_end, 2.0 * mark_y..y_top)?;
    let y_labels = |y: &f64| {
        if *y < 0.0 {
            String::new()
        } else {
            format!("{y:.0}")
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_labels(5)
        .y_label_formatter(&y_labels)
        .x_label_formatter(&|x| format!("{x:.1} s"))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;

    // The busiest window, shaded.
    if o.worst.units > 0 {
        let from = o.worst.first as f64 / SECOND as f64;
        let to = (o.worst.first + period) as f64 / SECOND as f64;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(from, 0.0), (to.min(x_end), y_top)],
            RGBColor(255, 220, 120).mix(0.35).filled(),
        )))?;
    }
    // The limit and the promised bound.
    chart.draw_series(LineSeries::new([(0.0, count), (x_end, count)], BLACK))?;
    if o.bound as f64 != count {
        let bound = o.bound as f64;
        chart.draw_series(DashedLineSeries::new(
            [(0.0, bound), (x_end, bound)],
            6,
            4,
            RGBColor(230, 120, 0).into(),
        ))?;
    }
    // Units admitted in the trailing window, for the key of the busiest window.
    chart.draw_series(LineSeries::new(
        trailing_steps(stream, admitted, o.worst.key, period),
        BLUE.stroke_width(2),
    ))?;
    // Every request (sampled past MAX_MARKS).
    let step = stream.requests.len().div_ceil(MAX_MARKS).max(1);
    let marks = stream
        .requests
        .iter()
        .zip(admitted)
        .step_by(step)
        .map(|(r, &a)| (r.at as f64 / SECOND as f64, a));
    chart.draw_series(
        marks
            .clone()
            .filter(|(_, a)| *a)
            .map(|(x, _)| Circle::new((x, mark_y), 3, GREEN.filled())),
    )?;
    chart.draw_series(
        marks
            .filter(|(_, a)| !*a)
            .map(|(x, _)| Cross::new((x, mark_y), 3, RED.stroke_width(1))),
    )?;
    Ok(())
}

/// The step line of units admitted in `(t - period, t]` for `key`, as (seconds, units) points.
fn trailing_steps(stream: &Stream, admitted: &[bool], key: usize, period: u64) -> Vec<(f64, f64)> {
    let mut events: Vec<(u64, i64)> = Vec::new();
    for (r, _) in stream
        .requests
        .iter()
        .zip(admitted)
        .filter(|&(r, &a)| a && r.key == key)
    {
        events.push((r.at, r.cost as i64));
        events.push((r.at + period, -(r.cost as i64)));
    }
    events.sort_unstable();
    let mut points = vec![(0.0, 0.0)];
    let mut level = 0i64;
    let stride = (events.len() / MAX_STEPS).max(1);
    for (n, chunk) in events.chunk_by(|a, b| a.0 == b.0).enumerate() {
        let x = chunk[0].0 as f64 / SECOND as f64;
        let before = level as f64;
        level += chunk.iter().map(|e| e.1).sum::<i64>();
        if n % stride == 0 {
            points.push((x, before));
            points.push((x, level as f64));
        }
    }
    points.push(((stream.end + period) as f64 / SECOND as f64, level as f64));
    points
}
