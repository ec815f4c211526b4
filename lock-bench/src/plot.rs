//! SVG plots: throughput against concurrency, acquire latency distributions,
//! handoff latency distributions. Each series differs from the others by
//! colour and marker shape; lockkit's backends are solid lines, the peer
//! libraries dotted, the servers' bounds dashed, and a goal that is one
//! value on a plot is a labelled line. The legend sits right of the data.

use std::path::Path;

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{HANDOFF_P99_GOAL_US, REDIS_SHARE_OF_PIPELINED_BOUND, Report};
use crate::stats::CURVE;

/// Ten colours far apart (no greys: two of those looked alike).
const COLORS: &[RGBColor] = &[
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
];

/// Goal lines: a colour no series has.
const GOAL: RGBColor = RGBColor(200, 0, 0);

/// Six shapes; with ten colours, the first 30 series all differ.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Marker {
    Circle,
    Triangle,
    Square,
    Diamond,
    Cross,
    Down,
}

const MARKERS: &[Marker] = &[
    Marker::Circle,
    Marker::Triangle,
    Marker::Square,
    Marker::Diamond,
    Marker::Cross,
    Marker::Down,
];

/// What a line is, which sets its dashes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// A lockkit backend: solid.
    Backend,
    /// A library users pick instead: dotted.
    Peer,
    /// A server's own bound: dashed.
    Bound,
    /// The same bound, pipelined: long dashes.
    PipelinedBound,
    /// A goal: dash-dot in the goal colour.
    Goal,
}

/// One line on a plot.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
    kind: Kind,
    color: RGBColor,
    marker: Option<Marker>,
}

/// A goal that is one value of a plot's y axis: drawn across the plot, or,
/// for a goal at one x only, as a short line ending there.
struct GoalLine {
    label: String,
    y: f64,
    at: Option<f64>,
}

/// The look of the `i`th subject, the same on every plot.
fn look(i: usize) -> (RGBColor, Marker) {
    (COLORS[i % COLORS.len()], MARKERS[i % MARKERS.len()])
}

fn subject_kind(kind: &str) -> Kind {
    if kind == "peer" {
        Kind::Peer
    } else {
        Kind::Backend
    }
}

/// Writes throughput.svg, acquire-latency.svg and handoff.svg into `dir`.
pub fn all(report: &Report, dir: &Path) -> Result<(), String> {
    let mut lines: Vec<Series> = report
        .subjects
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.uncontended.is_empty())
        .map(|(i, s)| {
            let (color, marker) = look(i);
            let points = s
                .uncontended
                .iter()
                .map(|u| (u.tasks as f64, u.pairs_per_s))
                .collect();
            Series {
                name: s.name.clone(),
                points,
                kind: subject_kind(&s.kind),
                color,
                marker: Some(marker),
            }
        })
        .collect();
    for (j, b) in report.bounds.iter().enumerate() {
        // A bound takes the colour of the backend measured against it.
        let color = report
            .subjects
            .iter()
            .position(|s| s.baseline.as_deref() == Some(b.name.as_str()))
            .map_or(COLORS[(COLORS.len() - 1 - j) % COLORS.len()], |i| look(i).0);
        lines.push(Series {
            name: format!("bound: {}", b.name),
            points: b
                .points
                .iter()
                .map(|p| (p.tasks as f64, p.pairs_per_s))
                .collect(),
            kind: Kind::Bound,
            color,
            marker: None,
        });
        let piped: Vec<_> = b
            .points
            .iter()
            .filter_map(|p| Some((p.tasks as f64, p.pipelined_pairs_per_s?)))
            .collect();
        if !piped.is_empty() {
            lines.push(Series {
                name: format!("bound: {} -P16", b.name),
                points: piped,
                kind: Kind::PipelinedBound,
                color,
                marker: None,
            });
        }
    }
    let bound64 = report
        .bounds
        .iter()
        .find(|b| b.name == "redis-benchmark")
        .and_then(|b| b.points.iter().find(|p| p.tasks == 64))
        .and_then(|p| p.pipelined_pairs_per_s);
    let redis_goal = bound64
        .filter(|_| report.subjects.iter().any(|s| s.name == "redis"))
        .map(|b| GoalLine {
            label: format!(
                "goal: redis >= {REDIS_SHARE_OF_PIPELINED_BOUND}x bound -P16 at 64 tasks"
            ),
            y: REDIS_SHARE_OF_PIPELINED_BOUND * b,
            at: Some(64.0),
        });
    chart(
        &dir.join("throughput.svg"),
        "Uncontended acquire+release pairs/s by concurrency",
        "tasks",
        "pairs/s",
        &lines,
        redis_goal.as_slice(),
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
        .enumerate()
        .filter_map(|(i, s)| {
            let u = s.uncontended.iter().find(|u| u.tasks == t)?;
            let (color, marker) = look(i);
            Some(Series {
                name: s.name.clone(),
                points: curve(&u.acquire_curve_us),
                kind: subject_kind(&s.kind),
                color,
                marker: Some(marker),
            })
        })
        .collect();
    chart(
        &dir.join("acquire-latency.svg"),
        &format!("Acquire latency distribution, {t} tasks (µs)"),
        "percentile",
        "µs",
        &curves,
        &[],
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
        .enumerate()
        .filter_map(|(i, s)| {
            let c = s
                .contended
                .iter()
                .find(|c| c.waiters == w && c.handoff.samples > 0)?;
            let (color, marker) = look(i);
            Some(Series {
                name: s.name.clone(),
                points: curve(&c.handoff_curve_us),
                kind: subject_kind(&s.kind),
                color,
                marker: Some(marker),
            })
        })
        .collect();
    let goal = GoalLine {
        label: "goal: handoff p99 < 5 ms (backends with wake-ups)".into(),
        y: HANDOFF_P99_GOAL_US,
        at: None,
    };
    chart(
        &dir.join("handoff.svg"),
        &format!("Handoff latency distribution (release to next grant), {w} waiters (µs)"),
        "percentile",
        "µs",
        &handoffs,
        &[goal],
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

/// A y-axis label: 1,200,000 as 1.2M, 15,000 as 15k.
fn short_number(y: f64) -> String {
    let a = y.abs();
    if a >= 1e6 {
        format!("{}M", trim(y / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(y / 1e3))
    } else if a >= 10.0 {
        format!("{y:.0}")
    } else {
        trim(y)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map_or(s.clone(), str::to_owned)
}

const WIDTH: u32 = 1140;
const HEIGHT: u32 = 520;
/// The strip right of the data that holds the legend.
const LEGEND_WIDTH: u32 = 340;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    lines: &[Series],
    goals: &[GoalLine],
    log_x: bool,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Debug| format!("{}: {e:?}", path.display());
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let ys = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .chain(goals.iter().map(|g| g.y))
        .filter(|y| *y > 0.0);
    let (lo, hi) = ys.fold((f64::MAX, 0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let (lo, hi) = if hi > 0.0 {
        (lo / 1.5, hi * 1.5)
    } else {
        (1.0, 10.0)
    };
    let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let x_hi = xs.fold(1f64, f64::max);
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .margin_right(LEGEND_WIDTH)
        .x_label_area_size(40)
        .y_label_area_size(64);
    // The data in pixels: every line is then drawn the same way, on the
    // plot and in the legend.
    let (pixels, goal_ys, (left, top, right)) = if log_x {
        let mut chart = builder
            .build_cartesian_2d((1f64..x_hi.max(2.0)).log_scale(), (lo..hi).log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .label_style(("sans-serif", 13))
            .light_line_style(RGBColor(238, 238, 238))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| short_number(*y))
            .draw()
            .map_err(|e| err(&e))?;
        let area = chart.plotting_area().get_pixel_range();
        to_pixels(lines, goals, area, |p| chart.backend_coord(p))
    } else {
        let mut chart = builder
            .build_cartesian_2d(0f64..(CURVE.len() - 1) as f64, (lo..hi).log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .label_style(("sans-serif", 13))
            .light_line_style(RGBColor(238, 238, 238))
            .x_labels(CURVE.len())
            .x_label_formatter(&percentile_label)
            .y_label_formatter(&|y| short_number(*y))
            .draw()
            .map_err(|e| err(&e))?;
        let area = chart.plotting_area().get_pixel_range();
        to_pixels(lines, goals, area, |p| chart.backend_coord(p))
    };
    for (l, pts) in lines.iter().zip(&pixels) {
        line(&root, pts, l.kind, l.color).map_err(|e| err(&e))?;
        if let Some(m) = l.marker {
            for &p in pts {
                mark(&root, p, m, l.color, l.kind == Kind::Peer).map_err(|e| err(&e))?;
            }
        }
    }
    for (g, &(x, y)) in goals.iter().zip(&goal_ys) {
        if let Some(x) = x {
            // A goal at one x: a short line ending there, labelled in the legend.
            line(&root, &[(x - 60, y), (x, y)], Kind::Goal, GOAL).map_err(|e| err(&e))?;
            continue;
        }
        line(&root, &[(left, y), (right, y)], Kind::Goal, GOAL).map_err(|e| err(&e))?;
        // Left, where the distributions are lowest, on white so that a
        // line under it does not cross the words.
        let style = TextStyle::from(("sans-serif", 13).into_font())
            .color(&GOAL)
            .pos(Pos::new(HPos::Left, VPos::Bottom));
        let (w, h) = root
            .estimate_text_size(&g.label, &style)
            .map_err(|e| err(&e))?;
        let (x, y) = (left + 6, y - 4);
        let (w, h) = (i32::try_from(w).unwrap_or(0), i32::try_from(h).unwrap_or(0));
        root.draw(&Rectangle::new(
            [(x - 2, y - h - 1), (x + w + 2, y + 1)],
            WHITE.mix(0.85).filled(),
        ))
        .map_err(|e| err(&e))?;
        root.draw_text(&g.label, &style, (x, y))
            .map_err(|e| err(&e))?;
    }
    // The legend, right of the data.
    let x0 = right + 18;
    let row = 20;
    let entries = lines
        .iter()
        .map(|l| (l.name.as_str(), l.kind, l.color, l.marker))
        .chain(
            goals
                .iter()
                .map(|g| (g.label.as_str(), Kind::Goal, GOAL, None)),
        );
    for (j, (name, kind, color, marker)) in entries.enumerate() {
        let y = top + 8 + row * j as i32;
        line(&root, &[(x0, y), (x0 + 40, y)], kind, color).map_err(|e| err(&e))?;
        if let Some(m) = marker {
            mark(&root, (x0 + 20, y), m, color, kind == Kind::Peer).map_err(|e| err(&e))?;
        }
        let style =
            TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
        root.draw_text(&legend_name(name, kind), &style, (x0 + 48, y))
            .map_err(|e| err(&e))?;
    }
    let key = "solid: lockkit · dotted: peers · dashed: bounds";
    let style = TextStyle::from(("sans-serif", 12).into_font())
        .color(&RGBColor(90, 90, 90))
        .pos(Pos::new(HPos::Left, VPos::Center));
    let rows = lines.len() + goals.len();
    root.draw_text(key, &style, (x0, top + 8 + row * rows as i32 + 6))
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

/// Goal lines are wider than the legend: their label is on the plot too.
fn legend_name(name: &str, kind: Kind) -> String {
    if kind == Kind::Goal {
        name.split(" (").next().unwrap_or(name).to_owned()
    } else {
        name.to_owned()
    }
}

type Pixels = (
    Vec<Vec<(i32, i32)>>,
    Vec<(Option<i32>, i32)>,
    (i32, i32, i32),
);

/// Maps each line's points with `at`, dropping those a log axis cannot show;
/// also where the goals are (x only for a goal at one x) and the data area's left, top and right edges.
fn to_pixels(
    lines: &[Series],
    goals: &[GoalLine],
    (xs, ys): (std::ops::Range<i32>, std::ops::Range<i32>),
    at: impl Fn(&(f64, f64)) -> (i32, i32),
) -> Pixels {
    let pixels = lines
        .iter()
        .map(|l| l.points.iter().filter(|p| p.1 > 0.0).map(&at).collect())
        .collect();
    let goal_ys = goals
        .iter()
        .map(|g| {
            let (x, y) = at(&(g.at.unwrap_or(1.0), g.y));
            (g.at.map(|_| x), y)
        })
        .collect();
    (pixels, goal_ys, (xs.start, ys.start, xs.end))
}

/// Draws a line through `pts` (pixels) in the dashes of its kind.
fn line(
    area: &Area,
    pts: &[(i32, i32)],
    kind: Kind,
    color: RGBColor,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>> {
    let pts = pts.iter().copied();
    match kind {
        Kind::Backend => area.draw(&PathElement::new(
            pts.collect::<Vec<_>>(),
            color.stroke_width(2),
        )),
        Kind::Peer => area.draw(&DashedPathElement::new(pts, 2, 4, color.stroke_width(2))),
        Kind::Bound => area.draw(&DashedPathElement::new(pts, 9, 5, color.stroke_width(2))),
        Kind::PipelinedBound => {
            area.draw(&DashedPathElement::new(pts, 18, 4, color.stroke_width(2)))
        }
        Kind::Goal => area.draw(&DashedPathElement::new(pts, 12, 3, color.stroke_width(2))),
    }
}

/// Draws marker `m` centred on `p` (pixels); hollow for a peer library.
fn mark(
    area: &Area,
    p: (i32, i32),
    m: Marker,
    color: RGBColor,
    hollow: bool,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>> {
    let style = if hollow {
        color.stroke_width(2)
    } else {
        color.filled()
    };
    let (x, y) = p;
    let r = 4;
    match m {
        Marker::Circle => area.draw(&Circle::new(p, r, style)),
        Marker::Square => area.draw(&Rectangle::new([(x - r, y - r), (x + r, y + r)], style)),
        Marker::Cross => area.draw(&Cross::new(p, r, color.stroke_width(2))),
        shape => {
            let pts = match shape {
                Marker::Triangle => vec![(x, y - r - 1), (x + r + 1, y + r), (x - r - 1, y + r)],
                Marker::Down => vec![(x, y + r + 1), (x + r + 1, y - r), (x - r - 1, y - r)],
                _ => vec![
                    (x, y - r - 1),
                    (x + r + 1, y),
                    (x, y + r + 1),
                    (x - r - 1, y),
                ],
            };
            if hollow {
                let mut closed = pts.clone();
                closed.push(pts[0]);
                area.draw(&PathElement::new(closed, style))
            } else {
                area.draw(&Polygon::new(pts, style))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Machine, Subject};
    use crate::scenarios::Uncontended;

    #[test]
    fn axis_numbers_are_short() {
        assert_eq!(short_number(1_200_000.0), "1.2M");
        assert_eq!(short_number(15_000.0), "15k");
        assert_eq!(short_number(100_000.0), "100k");
        assert_eq!(short_number(950.0), "950");
        assert_eq!(short_number(1.5), "1.5");
    }

    #[test]
    fn the_first_thirty_subjects_all_look_different() {
        let mut looks: Vec<String> = (0..30).map(|i| format!("{:?}", look(i))).collect();
        looks.sort();
        looks.dedup();
        assert_eq!(looks.len(), 30);
    }

    #[test]
    fn the_plots_carry_the_legend_and_the_goal() {
        let mut report = Report::new(crate::Mode::Quick, Machine::default());
        let mut redis = Subject::new("redis", "backend", "redis://x");
        redis.uncontended = [1, 64]
            .map(|tasks| Uncontended {
                tasks,
                pairs: 1,
                pairs_per_s: 1000.0 * tasks as f64,
                acquire: crate::stats::Latency::default(),
                acquire_curve_us: CURVE.iter().map(|q| 100.0 + 1000.0 * q).collect(),
                errors: 0,
                first_error: None,
            })
            .to_vec();
        report.subjects.push(redis);
        report.bounds.push(crate::Bound {
            name: "redis-benchmark".into(),
            method: String::new(),
            points: vec![crate::BoundPoint {
                tasks: 64,
                pairs_per_s: 40_000.0,
                pipelined_pairs_per_s: Some(100_000.0),
                acquire_p50_us: None,
                detail: String::new(),
            }],
            handoffs: Vec::new(),
            errors: Vec::new(),
        });
        let dir = std::env::temp_dir().join(format!("lockkit-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        all(&report, &dir).expect("the plots");
        let svg = |name: &str| std::fs::read_to_string(dir.join(name)).expect("a plot");
        let throughput = svg("throughput.svg");
        assert!(throughput.contains("\nredis\n"));
        assert!(throughput.contains("bound: redis-benchmark -P16"));
        assert!(throughput.contains("goal: redis &gt;= 0.8x bound -P16 at 64 tasks"));
        assert!(svg("acquire-latency.svg").contains("\nredis\n"));
        assert!(svg("handoff.svg").contains("goal: handoff p99"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
