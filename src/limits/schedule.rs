//! A campaign's schedule (dayparting, docs/semantics.md §6.8): spans of
//! local hours per day of the week in one time zone, in which its
//! candidates are eligible. Pure: an instant in, whether it is inside, and
//! when the next span opens.
//!
//! The local time of an instant is the zone's (the IANA database): in a
//! repeated hour (autumn) both passes are inside a span covering it; a
//! skipped hour (spring) never happens, so a span inside it is never open
//! that day (§5.2).

use crossbeam_utils::atomic::AtomicCell;
use jiff::tz::TimeZone;

use crate::clock::Nanos;

/// One minute in ns: eligibility is constant within a minute of UTC for
/// every zone whose offset is whole minutes (every zone since 1972).
const MINUTE: Nanos = 60_000_000_000;

/// A compiled schedule.
#[derive(Debug)]
pub struct Schedule {
    tz: TimeZone,
    /// Per day of the week, Monday first: the open spans `[from, until)`
    /// in minutes of the local day (`until` up to 1 440).
    days: [Vec<(u16, u16)>; 7],
    /// The last minute looked at (ns since the epoch / [`MINUTE`], + 1; 0:
    /// none) and whether it was open: every candidate of a screen asks
    /// about the same minute, and a zone conversion costs ~0.3 µs.
    last: AtomicCell<(u64, bool)>,
}

impl PartialEq for Schedule {
    fn eq(&self, o: &Self) -> bool {
        self.tz == o.tz && self.days == o.days
    }
}

impl Schedule {
    /// A schedule in `tz` of `spans`: (days, from, until) with days Monday =
    /// 0 to Sunday = 6 and `from` < `until` ≤ 1 440 minutes (the caller
    /// validated them).
    pub fn new(tz: TimeZone, spans: &[(Vec<u8>, u16, u16)]) -> Schedule {
        let mut days: [Vec<(u16, u16)>; 7] = Default::default();
        for (ds, from, until) in spans {
            for &d in ds {
                if let Some(v) = days.get_mut(usize::from(d)) {
                    v.push((*from, *until));
                }
            }
        }
        for v in &mut days {
            v.sort_unstable();
        }
        Schedule {
            tz,
            days,
            last: AtomicCell::new((0, false)),
        }
    }

    /// The local day of the week (Monday = 0) and minute of the day at `t`.
    fn local(&self, t: Nanos) -> Option<(usize, u16, jiff::civil::Date)> {
        let ts = jiff::Timestamp::from_nanosecond(i128::from(t)).ok()?;
        let dt = ts.to_zoned(self.tz.clone()).datetime();
        let day = usize::from(dt.weekday().to_monday_zero_offset().unsigned_abs());
        let minute = u16::try_from(i32::from(dt.hour()) * 60 + i32::from(dt.minute())).ok()?;
        Some((day, minute, dt.date()))
    }

    /// Whether `now` is inside a span.
    pub fn open_at(&self, now: Nanos) -> bool {
        let key = now / MINUTE + 1;
        let (k, open) = self.last.load();
        if k == key {
            return open;
        }
        let open = self.local(now).is_some_and(|(day, minute, _)| {
            self.days[day]
                .iter()
                .any(|&(from, until)| from <= minute && minute < until)
        });
        self.last.store((key, open));
        open
    }

    /// The first instant after `now` at which a span opens, within the
    /// coming week and a day; `None` if none does (a schedule open only in
    /// an hour every day skips).
    pub fn next_open(&self, now: Nanos) -> Option<Nanos> {
        let (today, minute, date) = self.local(now)?;
        let mut best: Option<Nanos> = None;
        for offset in 0..=7i64 {
            let day = (today + offset as usize) % 7;
            let Ok(d) = date.checked_add(jiff::Span::new().days(offset)) else {
                continue;
            };
            for &(from, _) in &self.days[day] {
                if offset == 0 && from <= minute {
                    continue;
                }
                let at = d.at(
                    i8::try_from(from / 60).unwrap_or(0),
                    i8::try_from(from % 60).unwrap_or(0),
                    0,
                    0,
                );
                // A local time in a skipped hour is taken as the instant
                // after the gap (jiff's "compatible" rule).
                let Some(t) = at
                    .to_zoned(self.tz.clone())
                    .ok()
                    .and_then(|z| Nanos::try_from(z.timestamp().as_nanosecond()).ok())
                else {
                    continue;
                };
                if t > now && best.is_none_or(|b| t < b) {
                    best = Some(t);
                }
            }
            if best.is_some() {
                return best;
            }
        }
        best
    }
}

impl Schedule {
    /// The open spans within `[start, end)`, as ordered, disjoint instants
    /// `[from, until)`: what a budget paced over scheduled time spreads its
    /// line over (docs/semantics.md §6.8). Local times convert as
    /// [`Schedule::next_open`] does (a skipped one is the instant after the
    /// gap), so a span inside a skipped hour is empty and one covering a
    /// repeated hour holds both passes.
    pub fn open_spans(&self, start: Nanos, end: Nanos) -> Vec<(Nanos, Nanos)> {
        let mut out: Vec<(Nanos, Nanos)> = Vec::new();
        let (Some((_, _, first)), Some((_, _, last))) = (self.local(start), self.local(end)) else {
            return out;
        };
        let instant = |d: jiff::civil::Date, minute: u16| -> Option<Nanos> {
            let (d, minute) = match minute {
                1_440 => (d.tomorrow().ok()?, 0),
                m => (d, m),
            };
            let at = d.at(
                i8::try_from(minute / 60).ok()?,
                i8::try_from(minute % 60).ok()?,
                0,
                0,
            );
            let z = at.to_zoned(self.tz.clone()).ok()?;
            Nanos::try_from(z.timestamp().as_nanosecond()).ok()
        };
        let mut d = first;
        // One local day at a time, the last included: a span of the day
        // before `start` cannot reach past it (spans end by midnight).
        for _ in 0..=(MAX_DAYS) {
            let day = usize::from(d.weekday().to_monday_zero_offset().unsigned_abs());
            for &(from, until) in &self.days[day] {
                let (Some(a), Some(b)) = (instant(d, from), instant(d, until)) else {
                    continue;
                };
                let (a, b) = (a.max(start), b.min(end));
                if a < b {
                    out.push((a, b));
                }
            }
            if d >= last {
                break;
            }
            let Ok(next) = d.tomorrow() else { break };
            d = next;
        }
        // Spans of one day may overlap (written so): merged.
        merge_spans(out)
    }
}

/// `spans` in order, those that overlap or touch made one.
pub fn merge_spans(mut spans: Vec<(Nanos, Nanos)>) -> Vec<(Nanos, Nanos)> {
    spans.sort_unstable();
    let mut merged: Vec<(Nanos, Nanos)> = Vec::with_capacity(spans.len());
    for (a, b) in spans {
        match merged.last_mut() {
            Some(m) if a <= m.1 => m.1 = m.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// The most local days [`Schedule::open_spans`] walks: a budget's longest
/// period is a flight of 92 days (`crate::limits::budget::MAX_FLIGHT_NS`),
/// a month is 31.
const MAX_DAYS: usize = 100;

#[cfg(test)]
mod tests {
    use super::*;

    /// 2023-11-13T00:00:00Z, a Monday.
    const MON: Nanos = 1_699_833_600_000_000_000;
    const H: Nanos = 60 * MINUTE;

    fn weekdays_9_to_5(tz: &str) -> Schedule {
        Schedule::new(
            TimeZone::get(tz).unwrap(),
            &[((0..5).collect(), 9 * 60, 17 * 60)],
        )
    }

    #[test]
    fn open_inside_its_spans_only() {
        let s = weekdays_9_to_5("UTC");
        assert!(!s.open_at(MON + 9 * H - 1));
        assert!(s.open_at(MON + 9 * H));
        assert!(s.open_at(MON + 17 * H - 1));
        assert!(!s.open_at(MON + 17 * H));
        // Saturday at noon.
        assert!(!s.open_at(MON + 5 * 24 * H + 12 * H));
        assert_eq!(s.next_open(MON + 17 * H), Some(MON + 24 * H + 9 * H));
        // Friday evening: Monday morning.
        assert_eq!(
            s.next_open(MON + 4 * 24 * H + 18 * H),
            Some(MON + 7 * 24 * H + 9 * H)
        );
    }

    #[test]
    fn local_hours_of_the_zone_and_until_midnight() {
        // 09:00 in Paris is 08:00 UTC in November (UTC+1).
        let s = weekdays_9_to_5("Europe/Paris");
        assert!(!s.open_at(MON + 8 * H - 1));
        assert!(s.open_at(MON + 8 * H));
        let late = Schedule::new(TimeZone::UTC, &[(vec![0], 22 * 60, 24 * 60)]);
        assert!(late.open_at(MON + 24 * H - 1));
        assert!(!late.open_at(MON + 24 * H));
    }

    #[test]
    fn a_dst_change_keeps_local_hours() {
        // 2024-03-31 (a Sunday): Paris goes from UTC+1 to UTC+2 at 02:00.
        // A span 09:00–10:00 local is 07:00–08:00 UTC that day.
        let sun = 1_711_843_200_000_000_000; // 2024-03-31T00:00:00Z
        let s = Schedule::new(
            TimeZone::get("Europe/Paris").unwrap(),
            &[(vec![6], 9 * 60, 10 * 60)],
        );
        assert!(!s.open_at(sun + 7 * H - 1));
        assert!(s.open_at(sun + 7 * H));
        assert!(!s.open_at(sun + 8 * H));
        assert_eq!(s.next_open(sun), Some(sun + 7 * H));
    }

    #[test]
    fn open_spans_are_the_instants_open_in_a_period() {
        let s = weekdays_9_to_5("UTC");
        let week = s.open_spans(MON, MON + 7 * 24 * H);
        let want: Vec<(Nanos, Nanos)> = (0..5)
            .map(|d| (MON + d * 24 * H + 9 * H, MON + d * 24 * H + 17 * H))
            .collect();
        assert_eq!(week, want);
        // Clipped to the period; every instant of a span is open.
        assert_eq!(
            s.open_spans(MON + 12 * H, MON + 24 * H + 10 * H),
            [(MON + 12 * H, MON + 17 * H), (MON + 33 * H, MON + 34 * H)]
        );
        for (a, b) in week {
            assert!(s.open_at(a) && s.open_at(b - 1) && !s.open_at(b));
        }
        // Overlapping spans merge; a span to 24:00 ends at midnight.
        let o = Schedule::new(
            TimeZone::UTC,
            &[(vec![0], 8 * 60, 12 * 60), (vec![0], 10 * 60, 24 * 60)],
        );
        assert_eq!(
            o.open_spans(MON, MON + 48 * H),
            [(MON + 8 * H, MON + 24 * H)]
        );
        // Paris springs forward at 02:00 on 2024-03-31: a span 01:00-04:00
        // local lasts two hours, 00:00-02:00 UTC.
        let sun = 1_711_843_200_000_000_000;
        let p = Schedule::new(
            TimeZone::get("Europe/Paris").unwrap(),
            &[(vec![6], 60, 4 * 60)],
        );
        assert_eq!(
            p.open_spans(sun - 24 * H, sun + 24 * H),
            [(sun, sun + 2 * H)]
        );
    }
}
