//! Draws a simulation as SVG: a legend, then one lane per algorithm with every request as
//! admitted (green dot) or refused (red cross) over time, the units admitted in the trailing
//! window of one period (blue steps) against the limit (black) and the promised bound (orange),
//! and the busiest window shaded. The time axis spans the traffic, with a small margin.

use plotters::prelude::*;
use tollgate::Quota;

use super::engine::{secs, why_same, worst_text, Outcome, Stream, SECOND};

/// At most this many request marks per lane; beyond it every n-th is drawn (the counts and the
/// trailing line are always exact).
const MAX_MARKS: usize = 4_000;
/// At most this many steps of the trailing-window line per lane.
const MAX_STEPS: usize = 20_000;

const LANE_HEIGHT: u32 = 200;
const LEGEND_HEIGHT: u32 = 30;
const WIDTH: u32 = 1_100;

const BAND: RGBColor = RGBColor(255, 220, 120);
const ORANGE: RGBColor = RGBColor(230, 120, 0);

/// The time axis, in seconds: the traffic plus a twentieth of its span on each side (a
/// millisecond at least, so one request still gets an axis).
fn x_range(stream: &Stream, period: u64) -> (f64, f64) {
    match (stream.requests.first(), stream.requests.last()) {
        (Some(first), Some(last)) => {
            let margin = ((last.at - first.at) / 20).max(1_000);
            (
                first.at.saturating_sub(margin) as f64 / SECOND as f64,
                (last.at + margin) as f64 / SECOND as f64,
            )
        }
        _ => (0.0, stream.end.max(period) as f64 / SECOND as f64),
    }
}

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
        let height = 40 + LEGEND_HEIGHT + LANE_HEIGHT * outcomes.len() as u32;
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root
            .titled(title, ("sans-serif", 20))
            .map_err(|e| e.to_string())?;
        let (legend, root) = root.split_vertically(LEGEND_HEIGHT);
        draw_legend(&legend, quota).map_err(|e| e.to_string())?;
        // One vertical scale for every lane, so lanes compare at a glance.
        let y_top = outcomes
            .iter()
            .map(|o| o.bound.max(o.worst.units))
            .max()
            .unwrap_or(0)
            .max(quota.count()) as f64
            + 1.0;
        let x = x_range(stream, quota.period_micros());
        let lanes = root.split_evenly((outcomes.len(), 1));
        for ((lane, outcome), admitted) in lanes.iter().zip(outcomes).zip(decisions) {
            draw_lane(lane, stream, quota, admitted, outcome, x, y_top)
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// One line saying what every mark of the lanes means.
fn draw_legend<'a>(area: &Area<'a>, quota: &Quota) -> Result<(), Box<dyn std::error::Error + 'a>> {
    let p = secs(quota.period_micros());
    let style = ("sans-serif", 13).into_font().color(&BLACK);
    let y = (LEGEND_HEIGHT / 2) as i32;
    let mut x = 50;
    let label = |x: &mut i32, text: String| -> Result<(), Box<dyn std::error::Error + 'a>> {
        area.draw(&Text::new(text.clone(), (*x, y - 7), style.clone()))?;
        let (w, _) = area.estimate_text_size(&text, &style)?;
        *x += w as i32 + 14;
        Ok(())
    };
    area.draw(&Circle::new((x, y), 4, GREEN.filled()))?;
    x += 9;
    label(&mut x, "admitted request".into())?;
    area.draw(&Cross::new((x, y), 4, RED.stroke_width(1)))?;
    x += 9;
    label(&mut x, "refused request".into())?;
    area.draw(&PathElement::new(
        [(x, y), (x + 22, y)],
        BLUE.stroke_width(2),
    ))?;
    x += 27;
    label(&mut x, format!("admitted in the last {p}"))?;
    area.draw(&PathElement::new([(x, y), (x + 22, y)], BLACK))?;
    x += 27;
    label(&mut x, format!("the limit ({})", quota.count()))?;
    for dash in 0..3 {
        let from = x + dash * 9;
        area.draw(&PathElement::new([(from, y), (from + 5, y)], ORANGE))?;
    }
    x += 27;
    label(&mut x, format!("most it promises in any {p}"))?;
    area.draw(&Rectangle::new(
        [(x, y - 7), (x + 22, y + 7)],
        BAND.mix(0.35).filled(),
    ))?;
    x += 27;
    label(&mut x, format!("its busiest {p}"))?;
    Ok(())
}

fn draw_lane<'a>(
    lane: &Area<'a>,
    stream: &Stream,
    quota: &Quota,
    admitted: &[bool],
    o: &Outcome,
    (x_start, x_end): (f64, f64),
    y_top: f64,
) -> Result<(), Box<dyn std::error::Error + 'a>> {
    let period = quota.period_micros();
    let count = quota.count() as f64;
    let mark_y = -0.08 * y_top;
    let headline = match o.same_as {
        Some(reference) => format!(
            "{}, the same decisions as {reference} ({})",
            o.kind,
            if why_same(o.kind, reference).starts_with("the same limit") {
                "the same limit expressed another way"
            } else {
                "on this traffic"
            }
        ),
        None => o.kind.to_string(),
    };
    let caption = format!(
        "{headline}: admitted {} of {}; most in any {}: {}; promised at most {}{}",
        o.admitted,
        o.offered,
        secs(period),
        worst_text(&o.worst),
        o.bound,
        if stream.keys.len() > 1 {
            format!("; key {}", stream.keys[o.worst.key])
        } else {
            String::new()
        }
    );
    let mut chart = ChartBuilder::on(lane)
        .caption(caption, ("sans-serif", 14))
        .margin(6)
        .x_label_area_size(22)
        .y_label_area_size(40)
        .build_cartesian_2d(x_start..x_end, 2.0 * mark_y..y_top)?;
    let y_labels = |y: &f64| {
        if *y < 0.0 {
            String::new()
        } else {
            format!("{y:.0}")
        }
    };
    // As many decimals as the axis needs to tell its ticks apart.
    let span = x_end - x_start;
    let decimals = if span >= 20.0 {
        0
    } else if span >= 2.0 {
        1
    } else if span >= 0.2 {
        2
    } else {
        3
    };
    let x_labels = move |x: &f64| format!("{x:.decimals$} s");
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_labels(5)
        .y_label_formatter(&y_labels)
        .x_label_formatter(&x_labels)
        .light_line_style(WHITE.mix(0.0))
        .draw()?;

    // The busiest window, shaded.
    if o.worst.units > 0 {
        let from = o.worst.first as f64 / SECOND as f64;
        let to = (o.worst.first + period) as f64 / SECOND as f64;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(from.max(x_start), 0.0), (to.min(x_end), y_top)],
            BAND.mix(0.35).filled(),
        )))?;
    }
    // The limit and the promised bound.
    chart.draw_series(LineSeries::new([(x_start, count), (x_end, count)], BLACK))?;
    if o.bound as f64 != count {
        let bound = o.bound as f64;
        chart.draw_series(DashedLineSeries::new(
            [(x_start, bound), (x_end, bound)],
            6,
            4,
            ORANGE.into(),
        ))?;
    }
    // Units admitted in the trailing window, for the key of the busiest window.
    chart.draw_series(LineSeries::new(
        clip(
            trailing_steps(stream, admitted, o.worst.key, period),
            x_start,
            x_end,
        ),
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

/// The part of a step line (points in time order) inside `[from, to]`, with its level at both
/// ends.
fn clip(points: Vec<(f64, f64)>, from: f64, to: f64) -> Vec<(f64, f64)> {
    let level_at = |x: f64| {
        points
            .iter()
            .take_while(|p| p.0 <= x)
            .last()
            .map_or(0.0, |p| p.1)
    };
    let mut out = vec![(from, level_at(from))];
    out.extend(points.iter().copied().filter(|p| p.0 > from && p.0 < to));
    out.push((to, level_at(to)));
    out
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
