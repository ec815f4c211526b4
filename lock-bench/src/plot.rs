//! SVG plots: throughput against concurrency, acquire latency distributions,
//! handoff latency distributions.

use std::path::Path;

use plotters::prelude::*;

use crate::report::Report;
use crate::stats::CURVE;

const COLORS: &[RGBColor] = &[
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
    RGBColor(90, 90, 160),
];

type Series = (String, Vec<(f64, f64)>, bool);

/// Writes throughput.svg, acquire-latency.svg and handoff.svg into `dir`.
pub fn all(report: &Report, dir: &Path) -> Result<(), String> {
    let mut lines: Vec<Series> = report
        .subjects
        .iter()
        .filter(|s| !s.uncontended.is_empty())
        .map(|s| {
            let pts = s
                .uncontended
                .iter()
                .map(|u| (u.tasks as f64, u.pairs_per_s))
                .collect();
            (s.name.clone(), pts, false)
        })
        .collect();
    for b in &report.bounds {
        lines.push((
            format!("bound: {}", b.name),
            b.points
                .iter()
                .map(|p| (p.tasks as f64, p.pairs_per_s))
                .collect(),
            true,
        ));
        let piped: Vec<_> = b
            .points
            .iter()
            .filter_map(|p| Some((p.tasks as f64, p.pipelined_pairs_per_s?)))
            .collect();
        if !piped.is_empty() {
            lines.push((format!("bound: {} -P16", b.name), piped, true));
        }
    }
    chart(
        &dir.join("throughput.svg"),
        "Uncontended acquire+release pairs/s by concurrency",
        "tasks",
        "pairs/s",
        &lines,
        true,
    )?;

    let t = if report
        .subjects
        .iter()
        .any(|s| s.uncontended.iter().any(|u| u.tasks == 64))
    {
        64
    } else {
        1
    };
    let curves: Vec<Series> = report
        .subjects
        .iter()
        .filter_map(|s| {
            let u = s.uncontended.iter().find(|u| u.tasks == t)?;
            Some((s.name.clone(), curve(&u.acquire_curve_us), false))
        })
        .collect();
    chart(
        &dir.join("acquire-latency.svg"),
        &format!("Acquire latency distribution, {t} tasks (µs)"),
        "percentile",
        "µs",
        &curves,
        false,
    )?;

    let w = report
        .subjects
        .iter()
        .flat_map(|s| s.contended.iter().map(|c| c.waiters))
        .max()
        .unwrap_or(0);
    let handoffs: Vec<Series> = report
        .subjects
        .iter()
        .filter_map(|s| {
            let c = s
                .contended
                .iter()
                .find(|c| c.waiters == w && c.handoff.samples > 0)?;
            Some((s.name.clone(), curve(&c.handoff_curve_us), false))
        })
        .collect();
    chart(
        &dir.join("handoff.svg"),
        &format!("Handoff latency distribution (release to next grant), {w} waiters (µs)"),
        "percentile",
        "µs",
        &handoffs,
        false,
    )
}

fn curve(values: &[f64]) -> Vec<(f64, f64)> {
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as f64, v))
        .collect()
}

fn percentile_label(x: &f64) -> String {
    let i = x.round() as usize;
    if (x - i as f64).abs() > 0.01 {
        return String::new();
    }
    match CURVE.get(i) {
        Some(0.0) => "min".into(),
        Some(1.0) => "max".into(),
        Some(q) => format!("p{}", q * 100.0),
        None => String::new(),
    }
}

fn chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    lines: &[Series],
    log_x: bool,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Debug| format!("{}: {e:?}", path.display());
    let root = SVGBackend::new(path, (760, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let ys = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.1))
        .filter(|y| *y > 0.0);
    let (lo, hi) = ys.fold((f64::MAX, 0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let (lo, hi) = if hi > 0.0 {
        (lo / 1.5, hi * 1.5)
    } else {
        (1.0, 10.0)
    };
    let xs = lines.iter().flat_map(|l| l.1.iter().map(|p| p.0));
    let x_hi = xs.fold(1f64, f64::max);
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64);
    let style = |i: usize, bound: bool| {
        let c = COLORS[i % COLORS.len()];
        if bound {
            c.mix(0.55).stroke_width(1)
        } else {
            c.stroke_width(2)
        }
    };
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            for (i, (name, pts, bound)) in lines.iter().enumerate() {
                let s = style(i, *bound);
                chart
                    .draw_series(LineSeries::new(
                        pts.iter().copied().filter(|p| p.1 > 0.0),
                        s,
                    ))
                    .map_err(|e| err(&e))?
                    .label(name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], s));
                chart
                    .draw_series(
                        pts.iter()
                            .filter(|p| p.1 > 0.0)
                            .map(|&p| Circle::new(p, 2, s.filled())),
                    )
                    .map_err(|e| err(&e))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.4))
                .label_font(("sans-serif", 11))
                .draw()
                .map_err(|e| err(&e))?;
        }};
    }
    if log_x {
        let mut chart = builder
            .build_cartesian_2d((1f64..x_hi.max(2.0)).log_scale(), (lo..hi).log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()
            .map_err(|e| err(&e))?;
        draw!(chart);
    } else {
        let mut chart = builder
            .build_cartesian_2d(0f64..(CURVE.len() - 1) as f64, (lo..hi).log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_labels(CURVE.len())
            .x_label_formatter(&percentile_label)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()
            .map_err(|e| err(&e))?;
        draw!(chart);
    }
    root.present().map_err(|e| err(&e))
}
