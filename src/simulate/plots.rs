//! SVG pictures of a run, drawn with plotters' SVG backend (its own text
//! metrics: no system fonts needed). For each campaign: cumulative spend
//! against its target line, spend per local hour, and impressions per user
//! and day against the frequency cap; for all: delivery in % of budget.

use std::path::Path;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use plotters::coord::types;
use plotters::prelude::*;

use crate::clock::Nanos;

use super::report::{CampaignSummary, Summary};
use super::runner::{CampaignStats, RunStats};
use super::{SimCampaign, SimError};

const SIZE: (u32, u32) = (960, 440);

/// Colours told apart on screen and on paper (plotters' palette has yellows).
pub(super) const COLORS: [RGBColor; 8] = [
    RGBColor(200, 30, 30),
    RGBColor(30, 90, 200),
    RGBColor(230, 130, 0),
    RGBColor(40, 150, 60),
    RGBColor(140, 60, 180),
    RGBColor(0, 150, 160),
    RGBColor(120, 120, 120),
    RGBColor(170, 110, 40),
];
const HOUR: f64 = 3.6e12;

fn fail<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> SimError + '_ {
    move |e| SimError(format!("cannot draw {}: {e}", path.display()))
}

/// Hours since `start`, the x axis of the time plots.
fn hours(start: Nanos, t: Nanos) -> f64 {
    (t as f64 - start as f64) / HOUR
}

/// A label for `x` hours after `start`, in local time of `tz`: `HH:MM` for a
/// run of up to two days, `Mon HH:MM` beyond.
fn time_label(tz: &TimeZone, start: Nanos, span_h: f64, x: f64) -> String {
    let t = start as f64 + x * HOUR;
    let fmt = if span_h <= 48.0 { "%H:%M" } else { "%a %H:%M" };
    Timestamp::from_nanosecond(t as i128)
        .map(|ts| ts.to_zoned(tz.clone()).strftime(fmt).to_string())
        .unwrap_or_default()
}

/// The chart every time picture here is drawn on: hours since `start` (up
/// to `span`) labelled in local time of `tz`, against `0..y_max`.
struct TimeChart<'t> {
    tz: &'t TimeZone,
    start: Nanos,
    span: f64,
    y_max: f64,
    y_desc: &'t str,
}

type Chart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<types::RangedCoordf64, types::RangedCoordf64>>;

impl TimeChart<'_> {
    /// Builds the chart on `root` with `caption`, and draws its mesh.
    fn draw<'a, 'b>(
        &self,
        root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
        caption: &str,
        path: &Path,
    ) -> Result<Chart<'a, 'b>, SimError> {
        let mut chart = ChartBuilder::on(root)
            .caption(caption, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..self.span, 0f64..self.y_max)
            .map_err(fail(path))?;
        chart
            .configure_mesh()
            .y_label_formatter(&|y| format!("{y:.0}"))
            .max_light_lines(1)
            .x_labels(13)
            .x_label_formatter(&|x| time_label(self.tz, self.start, self.span, *x))
            .x_desc(format!(
                "local time ({})",
                self.tz.iana_name().unwrap_or("UTC")
            ))
            .y_desc(self.y_desc)
            .draw()
            .map_err(fail(path))?;
        Ok(chart)
    }
}

/// Draws the legend of `chart` at `at`, then writes the picture.
fn finish<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    root: &DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    at: SeriesLabelPosition,
    path: &Path,
) -> Result<(), SimError> {
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(fail(path))?;
    root.present().map_err(fail(path))
}

/// Draws every picture into `dir`.
pub fn all(
    dir: &Path,
    campaigns: &[SimCampaign],
    stats: &RunStats,
    summary: &Summary,
) -> Result<(), SimError> {
    delivery(&dir.join("delivery.svg"), campaigns, stats)?;
    for ((c, st), s) in campaigns
        .iter()
        .zip(&stats.campaigns)
        .zip(&summary.campaigns)
    {
        spend(&dir.join(format!("spend-{}.svg", c.id)), c, st, stats, s)?;
        hourly(&dir.join(format!("hourly-{}.svg", c.id)), c, st, stats)?;
        users(&dir.join(format!("users-{}.svg", c.id)), c, s)?;
    }
    Ok(())
}

/// Every budget campaign's delivery in % of its period's amount, with its
/// target line dashed in the same colour.
pub fn delivery(path: &Path, campaigns: &[SimCampaign], stats: &RunStats) -> Result<(), SimError> {
    let span = hours(stats.start, stats.end);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(fail(path))?;
    let mut chart = TimeChart {
        tz: &TimeZone::UTC,
        start: stats.start,
        span,
        y_max: 105.0,
        y_desc: "% of budget",
    }
    .draw(
        &root,
        "Delivery: % of each period's budget spent (dashed: target line)",
        path,
    )?;
    for (i, (c, st)) in campaigns.iter().zip(&stats.campaigns).enumerate() {
        let Some(b) = &c.budget else { continue };
        let color = COLORS[i % COLORS.len()];
        // Lines that coincide (two modes on the same line) stay visible: the
        // earlier ones are drawn wider, underneath.
        let width = (campaigns.len() - i + 1).clamp(2, 5) as u32;
        let amount = b.amount as f64;
        for (k, run) in by_period(&st.samples).into_iter().enumerate() {
            let pts: Vec<(f64, f64)> = run
                .iter()
                .map(|s| (hours(stats.start, s.at), s.spent as f64 * 100.0 / amount))
                .collect();
            let target: Vec<(f64, f64)> = run
                .iter()
                .map(|s| {
                    let (ps, pe) = b.calendar.bounds(s.at);
                    (
                        hours(stats.start, s.at),
                        b.target.cap(ps, pe, s.at) as f64 * 100.0 / amount,
                    )
                })
                .collect();
            chart
                .draw_series(DashedLineSeries::new(
                    target,
                    5,
                    4,
                    color.mix(0.6).stroke_width(1),
                ))
                .map_err(fail(path))?;
            let series = chart
                .draw_series(LineSeries::new(pts, color.stroke_width(width)))
                .map_err(fail(path))?;
            if k == 0 {
                let label = format!(
                    "{} ({}, {})",
                    c.id,
                    b.pacing,
                    c.tz.iana_name().unwrap_or("UTC")
                );
                series.label(label).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            }
        }
    }
    finish(&mut chart, &root, SeriesLabelPosition::LowerRight, path)
}

/// Splits samples into runs of one period each (a line per period, so the
/// reset at a period's start is not drawn as a fall).
fn by_period(samples: &[super::runner::Sample]) -> Vec<&[super::runner::Sample]> {
    samples
        .chunk_by(|a, b| a.period_start == b.period_start)
        .collect()
}

/// Cumulative spend against the target line and the cap pacing allows, with
/// the budget, for one campaign.
fn spend(
    path: &Path,
    c: &SimCampaign,
    st: &CampaignStats,
    stats: &RunStats,
    s: &CampaignSummary,
) -> Result<(), SimError> {
    let span = hours(stats.start, stats.end);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(fail(path))?;
    let Some(b) = &c.budget else {
        let title = format!("{}: no budget ({} impressions)", c.id, s.impressions);
        root.titled(&title, ("sans-serif", 18))
            .map_err(fail(path))?;
        return root.present().map_err(fail(path));
    };
    let amount = b.amount as f64;
    let title = format!(
        "{}: {} pacing, budget {} per period ({}) — delivered {}%, pacing error {}%",
        c.id,
        b.pacing,
        b.amount,
        c.tz.iana_name().unwrap_or("UTC"),
        s.delivered_pct.map_or("–".into(), |x| format!("{x:.1}")),
        s.pacing_rmse_pct.map_or("–".into(), |x| format!("{x:.2}")),
    );
    let mut chart = TimeChart {
        tz: &c.tz,
        start: stats.start,
        span,
        y_max: amount * 1.08,
        y_desc: "cumulative spend in the period",
    }
    .draw(&root, &title, path)?;
    let red = RGBColor(200, 30, 30);
    let orange = RGBColor(240, 150, 30);
    let blue = RGBColor(30, 90, 200);
    for (k, run) in by_period(&st.samples).into_iter().enumerate() {
        let (Some(first), Some(last)) = (run.first(), run.last()) else {
            continue;
        };
        let (ps, pe) = b.calendar.bounds(first.at);
        let x0 = hours(stats.start, ps.max(stats.start));
        let x1 = hours(stats.start, pe.min(stats.end)).max(hours(stats.start, last.at));
        let first_run = k == 0;
        let budget = chart
            .draw_series(LineSeries::new(
                vec![(x0, amount), (x1, amount)],
                red.stroke_width(1),
            ))
            .map_err(fail(path))?;
        if first_run {
            budget
                .label("budget")
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], red));
        }
        let target: Vec<(f64, f64)> = run
            .iter()
            .map(|s| (hours(stats.start, s.at), b.target.cap(ps, pe, s.at) as f64))
            .collect();
        let target = chart
            .draw_series(DashedLineSeries::new(target, 6, 4, BLACK.stroke_width(1)))
            .map_err(fail(path))?;
        if first_run {
            target
                .label("target line")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
        }
        let cap: Vec<(f64, f64)> = run
            .iter()
            .map(|s| (hours(stats.start, s.at), s.cap as f64))
            .collect();
        let cap = chart
            .draw_series(LineSeries::new(cap, orange.stroke_width(1)))
            .map_err(fail(path))?;
        if first_run {
            cap.label("cap allowed by pacing")
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], orange));
        }
        let spent: Vec<(f64, f64)> = run
            .iter()
            .map(|s| (hours(stats.start, s.at), s.spent as f64))
            .collect();
        let spent = chart
            .draw_series(LineSeries::new(spent, blue.stroke_width(2)))
            .map_err(fail(path))?;
        if first_run {
            spent.label("delivered").legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], blue.stroke_width(2))
            });
        }
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperLeft, path)
}

/// Spend per local hour (bars) against the target line's share of each hour
/// (outlined).
fn hourly(
    path: &Path,
    c: &SimCampaign,
    st: &CampaignStats,
    stats: &RunStats,
) -> Result<(), SimError> {
    let span = hours(stats.start, stats.end);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(fail(path))?;
    // Local hours of the span, with the target's share of each.
    let mut rows: Vec<(Nanos, Nanos, u64, Option<u64>)> = Vec::new();
    let mut h = c.hour_of(stats.start);
    while h < stats.end {
        // The next local hour starts where this one ends: one real hour on,
        // or sooner in a zone whose offset just changed by less than an hour.
        let end = c.hour_end(h).max(h + 1);
        let target = c.budget.as_ref().map(|b| {
            let (ps, pe) = b.calendar.bounds(h);
            let hi = b.target.cap(ps, pe, end.min(pe));
            let lo = b.target.cap(ps, pe, h);
            hi.saturating_sub(lo)
        });
        rows.push((h, end, st.hourly.get(&h).copied().unwrap_or(0), target));
        h = end;
    }
    let ymax = rows
        .iter()
        .map(|r| r.2.max(r.3.unwrap_or(0)))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let title = format!(
        "{}: spend per local hour ({}){}",
        c.id,
        c.tz.iana_name().unwrap_or("UTC"),
        if c.budget.is_some() {
            " — outlined: the target's share of the hour"
        } else {
            ""
        }
    );
    let mut chart = TimeChart {
        tz: &c.tz,
        start: stats.start,
        span,
        y_max: ymax * 1.1,
        y_desc: "spend in the hour",
    }
    .draw(&root, &title, path)?;
    let blue = RGBColor(30, 90, 200);
    chart
        .draw_series(rows.iter().map(|&(a, b, v, _)| {
            let (x0, x1) = (hours(stats.start, a), hours(stats.start, b));
            Rectangle::new(
                [(x0 + 0.06, 0.0), (x1 - 0.06, v as f64)],
                blue.mix(0.7).filled(),
            )
        }))
        .map_err(fail(path))?
        .label("delivered")
        .legend(move |(x, y)| {
            Rectangle::new([(x, y - 5), (x + 16, y + 5)], blue.mix(0.7).filled())
        });
    if c.budget.is_some() {
        chart
            .draw_series(rows.iter().filter_map(|&(a, b, _, t)| {
                let t = t? as f64;
                let (x0, x1) = (hours(stats.start, a), hours(stats.start, b));
                Some(Rectangle::new(
                    [(x0 + 0.06, 0.0), (x1 - 0.06, t)],
                    BLACK.stroke_width(1),
                ))
            }))
            .map_err(fail(path))?
            .label("target")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], BLACK.stroke_width(1)));
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperLeft, path)
}

/// How many user-days had 1, 2, ... impressions, with the per-user cap.
fn users(path: &Path, c: &SimCampaign, s: &CampaignSummary) -> Result<(), SimError> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(fail(path))?;
    let cap = c.user_cap.as_ref();
    let kmax = s
        .max_impressions_per_user_day
        .max(cap.map_or(1, |u| u.limit as u32 + 1))
        .max(1);
    let ymax = s
        .impressions_per_user_day
        .values()
        .copied()
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let title = match cap {
        Some(u) => format!(
            "{}: impressions per user and local day — cap {} per {}{}",
            c.id,
            u.limit,
            u.window,
            if u.per_local_day {
                ""
            } else {
                " (not a calendar day: compare with care)"
            }
        ),
        None => format!(
            "{}: impressions per user and local day (no per-user window cap)",
            c.id
        ),
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0.5f64..(f64::from(kmax) + 0.5), 0f64..ymax * 1.1)
        .map_err(fail(path))?;
    chart
        .configure_mesh()
        .y_label_formatter(&|y| format!("{y:.0}"))
        .max_light_lines(1)
        .x_labels(kmax.min(30) as usize)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .disable_x_mesh()
        .x_desc("impressions of this campaign to one user in one local day")
        .y_desc("user-days")
        .draw()
        .map_err(fail(path))?;
    let blue = RGBColor(30, 90, 200);
    chart
        .draw_series(s.impressions_per_user_day.iter().map(|(&k, &v)| {
            let k = f64::from(k);
            Rectangle::new(
                [(k - 0.35, 0.0), (k + 0.35, v as f64)],
                blue.mix(0.7).filled(),
            )
        }))
        .map_err(fail(path))?
        .label("user-days")
        .legend(move |(x, y)| {
            Rectangle::new([(x, y - 5), (x + 16, y + 5)], blue.mix(0.7).filled())
        });
    if let Some(u) = cap {
        let red = RGBColor(200, 30, 30);
        let x = u.limit as f64 + 0.5;
        chart
            .draw_series(LineSeries::new(
                vec![(x, 0.0), (x, ymax * 1.1)],
                red.stroke_width(2),
            ))
            .map_err(fail(path))?
            .label(format!(
                "cap: {} per {} (no user-day may pass it)",
                u.limit, u.window
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], red.stroke_width(2)));
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperRight, path)
}
