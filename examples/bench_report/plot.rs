//! Draws a section's plot as SVG with plotters (text as SVG `<text>`, no font files needed).

use plotters::prelude::*;

use super::model::Plot;

const SIZE: (u32, u32) = (800, 480);

/// A tick label: no decimals on a scale of hundreds or more, else as few as the scale needs.
fn tick(v: f64, max: f64) -> String {
    match max.abs() {
        m if m >= 100.0 => format!("{v:.0}"),
        m if m >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

/// The plot as an SVG document.
pub fn svg(plot: &Plot) -> Result<String, String> {
    let points = || plot.series.iter().flat_map(|(_, p)| p.iter().copied());
    let finite = |v: f64| v.is_finite();
    let xs: Vec<f64> = points().map(|p| p.0).filter(|&x| finite(x)).collect();
    let ys: Vec<f64> = points().map(|p| p.1).filter(|&y| finite(y)).collect();
    if xs.is_empty() {
        return Err(format!("plot {} has no points", plot.file));
    }
    let (x_min, x_max) = xs
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    let y_max = ys.iter().fold(0.0f64, |a, &y| a.max(y)) * 1.1;
    let y_max = if y_max > 0.0 { y_max } else { 1.0 };
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(&plot.title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(80);
        let colour = |i: usize| Palette99::pick(i).to_rgba();
        if plot.log_x && x_min > 0.0 {
            let (lo, hi) = if x_min == x_max {
                (x_min / 2.0, x_max * 2.0)
            } else {
                (x_min * 0.8, x_max * 1.25)
            };
            let mut chart = builder
                .build_cartesian_2d((lo..hi).log_scale(), 0.0..y_max)
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc(&plot.x_label)
                .y_desc(&plot.y_label)
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_label_formatter(&|y| tick(*y, y_max))
                .draw()
                .map_err(|e| e.to_string())?;
            for (i, (name, pts)) in plot.series.iter().enumerate() {
                let c = colour(i);
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                    .map_err(|e| e.to_string())?
                    .label(name)
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2))
                    });
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
                    .map_err(|e| e.to_string())?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| e.to_string())?;
        } else {
            let pad = ((x_max - x_min) * 0.05).max(0.5);
            let mut chart = builder
                .build_cartesian_2d((x_min - pad)..(x_max + pad), 0.0..y_max)
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc(&plot.x_label)
                .y_desc(&plot.y_label)
                .x_label_formatter(&|x| tick(*x, x_max - x_min))
                .y_label_formatter(&|y| tick(*y, y_max))
                .draw()
                .map_err(|e| e.to_string())?;
            for (i, (name, pts)) in plot.series.iter().enumerate() {
                let c = colour(i);
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                    .map_err(|e| e.to_string())?
                    .label(name)
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2))
                    });
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
                    .map_err(|e| e.to_string())?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_drop_decimals_the_scale_does_not_need() {
        assert_eq!(tick(100_000.0, 110_000.0), "100000");
        assert_eq!(tick(2.0, 14.0), "2.0");
        assert_eq!(tick(0.25, 1.5), "0.25");
    }

    #[test]
    fn draws_titles_labels_and_series_as_svg_text() {
        let plot = Plot {
            file: "t.svg".into(),
            title: "Decisions per second".into(),
            x_label: "concurrency".into(),
            y_label: "decisions/s".into(),
            log_x: true,
            series: vec![
                (
                    "batched".into(),
                    vec![(1.0, 10.0), (64.0, 100.0), (256.0, 120.0)],
                ),
                ("ceiling".into(), vec![(1.0, 90.0), (256.0, 90.0)]),
            ],
        };
        let svg = svg(&plot).unwrap();
        assert!(svg.starts_with("<svg"));
        for text in [
            "Decisions per second",
            "concurrency",
            "decisions/s",
            "batched",
            "ceiling",
        ] {
            assert!(svg.contains(text), "{text} is drawn");
        }
        let empty = Plot {
            series: vec![],
            ..plot
        };
        assert!(svg_err(&empty));
    }

    fn svg_err(p: &Plot) -> bool {
        svg(p).is_err()
    }
}
