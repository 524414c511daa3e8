//! Calendar periods in an IANA time zone: the local hour, day, ISO week (from
//! Monday) or month containing an instant (docs/semantics.md §2.2, §5.2).
//!
//! jiff does the time-zone arithmetic. A period starts at the first instant whose
//! local date (or hour) is the period's: a day whose midnight does not exist starts
//! at the transition, and a repeated local hour is two separate one-hour periods.
//! DST days are therefore 23 or 25 hours long, and every period here is computed,
//! not assumed to be 24 h.

use crossbeam_utils::atomic::AtomicCell;
use jiff::civil::Date;
use jiff::tz::{Disambiguation, OffsetConflict, TimeZone};
use jiff::{Timestamp, Zoned};

use crate::clock::Nanos;

/// Which calendar period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    Hour,
    Day,
    Week,
    Month,
}

/// A calendar unit in a time zone: knows the bounds of the period containing any
/// instant.
#[derive(Debug)]
pub struct Calendar {
    /// Hour, day, week or month.
    pub unit: CalendarUnit,
    /// The zone whose local time defines the periods.
    pub tz: TimeZone,
    /// The period most recently computed. Every key of an item lives in the same
    /// periods, so this spares all but the first key of each period the time-zone
    /// arithmetic. `AtomicCell` of a 16-byte value is a seqlock: readers never
    /// write, so threads reading it do not contend.
    last: AtomicCell<(Nanos, Nanos)>,
    /// A flight's one period (docs/semantics.md §6.7): every instant is
    /// in it, and nothing follows it.
    fixed: Option<(Nanos, Nanos)>,
}

impl Clone for Calendar {
    fn clone(&self) -> Self {
        Calendar {
            fixed: self.fixed,
            ..Calendar::new(self.unit, self.tz.clone())
        }
    }
}

impl PartialEq for Calendar {
    fn eq(&self, o: &Self) -> bool {
        self.unit == o.unit && self.tz == o.tz && self.fixed == o.fixed
    }
}

impl Calendar {
    /// Whether `[start, end)` could be one of this calendar's periods by its
    /// length alone: an hour is 30 to 90 minutes (a half-hour daylight
    /// saving shift), a day 22 to 26 hours, a week and a month within 2
    /// hours of 7 days and of 28 to 31 days. The ranges are disjoint, so a
    /// period of another unit is told without a time-zone computation.
    pub fn plausible(&self, start: Nanos, end: Nanos) -> bool {
        if let Some(f) = self.fixed {
            return f == (start, end);
        }
        const H: Nanos = 3_600 * crate::clock::SECOND;
        let len = end.saturating_sub(start);
        let range = match self.unit {
            CalendarUnit::Hour => H / 2..=3 * H / 2,
            CalendarUnit::Day => 22 * H..=26 * H,
            CalendarUnit::Week => 7 * 24 * H - 2 * H..=7 * 24 * H + 2 * H,
            CalendarUnit::Month => 28 * 24 * H - 2 * H..=31 * 24 * H + 2 * H,
        };
        range.contains(&len)
    }
}

/// Nominal length of a unit, used only where a rough length is meaningful (e.g.
/// comparing a calendar window with a fixed one when validating a stack).
pub fn nominal_nanos(unit: CalendarUnit) -> Nanos {
    const H: Nanos = 3_600 * crate::clock::SECOND;
    match unit {
        CalendarUnit::Hour => H,
        CalendarUnit::Day => 24 * H,
        CalendarUnit::Week => 7 * 24 * H,
        CalendarUnit::Month => 30 * 24 * H,
    }
}

fn to_ns(ts: Timestamp) -> Nanos {
    u64::try_from(ts.as_nanosecond()).unwrap_or(0)
}

impl Calendar {
    pub fn new(unit: CalendarUnit, tz: TimeZone) -> Self {
        Calendar {
            unit,
            tz,
            last: AtomicCell::new((0, 0)),
            fixed: None,
        }
    }

    /// One period, `[start, end)`, in zone `tz` (a flight's: its days are
    /// that zone's).
    pub fn fixed(start: Nanos, end: Nanos, tz: TimeZone) -> Self {
        Calendar {
            fixed: Some((start, end)),
            ..Calendar::new(CalendarUnit::Day, tz)
        }
    }

    /// The one period of a flight's calendar, if this is one.
    pub fn fixed_period(&self) -> Option<(Nanos, Nanos)> {
        self.fixed
    }

    /// `[start, end)` of the period starting at `end`, the end of one: none
    /// after a flight.
    pub fn period_after(&self, end: Nanos) -> Option<(Nanos, Nanos)> {
        match self.fixed {
            Some(_) => None,
            None => Some(self.bounds(end)),
        }
    }

    /// `[start, end)` of the period containing `now`.
    ///
    /// jiff only fails far outside the range a `u64` of nanoseconds reaches (years
    /// beyond 9999), so the fallback — the UTC-aligned period of nominal length —
    /// is unreachable in practice; it exists so this path cannot panic.
    pub fn bounds(&self, now: Nanos) -> (Nanos, Nanos) {
        if let Some(f) = self.fixed {
            return f;
        }
        let (s, e) = self.last.load();
        if s <= now && now < e {
            return (s, e);
        }
        let b = self.try_bounds(now).unwrap_or_else(|| {
            let len = nominal_nanos(self.unit);
            let start = now / len * len;
            (start, start.saturating_add(len))
        });
        self.last.store(b);
        b
    }

    /// `[start, end)` of the period that follows the one containing `now`.
    pub fn next_bounds(&self, now: Nanos) -> (Nanos, Nanos) {
        let (_, end) = self.bounds(now);
        self.bounds(end)
    }

    fn try_bounds(&self, now: Nanos) -> Option<(Nanos, Nanos)> {
        let ts = Timestamp::from_nanosecond(i128::from(now)).ok()?;
        let z = ts.to_zoned(self.tz.clone());
        match self.unit {
            CalendarUnit::Hour => self.hour_bounds(&z),
            CalendarUnit::Day => {
                let d = z.date();
                Some((self.day_start(d)?, self.day_start(d.tomorrow().ok()?)?))
            }
            CalendarUnit::Week => {
                let d = z.date();
                let back = i64::from(d.weekday().to_monday_zero_offset());
                let monday = d.checked_sub(jiff::Span::new().days(back)).ok()?;
                let next = monday.checked_add(jiff::Span::new().days(7)).ok()?;
                Some((self.day_start(monday)?, self.day_start(next)?))
            }
            CalendarUnit::Month => {
                let first = z.date().first_of_month();
                let next = first.checked_add(jiff::Span::new().months(1)).ok()?;
                Some((self.day_start(first)?, self.day_start(next)?))
            }
        }
    }

    /// The first instant of local date `d`: midnight, or the end of the gap when
    /// midnight is skipped, or the first of two midnights when it repeats. jiff's
    /// "compatible" disambiguation is exactly that rule.
    fn day_start(&self, d: Date) -> Option<Nanos> {
        let z = d
            .to_datetime(jiff::civil::Time::midnight())
            .to_zoned(self.tz.clone())
            .ok()?;
        Some(to_ns(z.timestamp()))
    }

    /// The local hour containing `z`. Truncating keeps the offset `z` has, so in a
    /// repeated hour the second occurrence truncates to its own start; the end is
    /// the start of the local hour one hour of real time later.
    fn hour_bounds(&self, z: &Zoned) -> Option<(Nanos, Nanos)> {
        let start = truncate_to_hour(z)?;
        let mut end_probe = start.checked_add(jiff::Span::new().hours(1)).ok()?;
        // In zones whose offset changes by less than an hour, one hour after the
        // start may land inside the same local hour; step until it does not.
        let mut end = truncate_to_hour(&end_probe)?;
        while end.timestamp() <= start.timestamp() {
            end_probe = end_probe.checked_add(jiff::Span::new().minutes(15)).ok()?;
            end = truncate_to_hour(&end_probe)?;
        }
        Some((to_ns(start.timestamp()), to_ns(end.timestamp())))
    }
}

fn truncate_to_hour(z: &Zoned) -> Option<Zoned> {
    z.with()
        .minute(0)
        .second(0)
        .subsec_nanosecond(0)
        .offset_conflict(OffsetConflict::PreferOffset)
        .disambiguation(Disambiguation::Compatible)
        .build()
        .ok()
}

/// The local hour of day (0–23) at instant `t` in `tz`.
pub fn local_hour(tz: &TimeZone, t: Nanos) -> usize {
    Timestamp::from_nanosecond(i128::from(t))
        .map(|ts| usize::from(ts.to_zoned(tz.clone()).hour().unsigned_abs()))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SECOND;

    const H: Nanos = 3_600 * SECOND;

    fn at(s: &str) -> Nanos {
        to_ns(s.parse::<Timestamp>().unwrap())
    }

    fn ny(unit: CalendarUnit) -> Calendar {
        Calendar::new(unit, TimeZone::get("America/New_York").unwrap())
    }

    #[test]
    fn dst_days_are_23_and_25_hours() {
        // 2026-03-08: clocks jump from 02:00 to 03:00 in New York.
        let (s, e) = ny(CalendarUnit::Day).bounds(at("2026-03-08T12:00:00Z"));
        assert_eq!(s, at("2026-03-08T05:00:00Z"));
        assert_eq!(e - s, 23 * H);
        // 2026-11-01: clocks fall back from 02:00 to 01:00.
        let (s, e) = ny(CalendarUnit::Day).bounds(at("2026-11-01T12:00:00Z"));
        assert_eq!(s, at("2026-11-01T04:00:00Z"));
        assert_eq!(e - s, 25 * H);
    }

    #[test]
    fn repeated_hour_is_two_windows() {
        let cal = ny(CalendarUnit::Hour);
        // 01:30 EDT (05:30Z) and 01:30 EST (06:30Z) are different windows.
        let a = cal.bounds(at("2026-11-01T05:30:00Z"));
        let b = cal.bounds(at("2026-11-01T06:30:00Z"));
        assert_eq!(a, (at("2026-11-01T05:00:00Z"), at("2026-11-01T06:00:00Z")));
        assert_eq!(b, (at("2026-11-01T06:00:00Z"), at("2026-11-01T07:00:00Z")));
    }

    #[test]
    fn missing_midnight_starts_at_transition() {
        // Santiago skips 2026-09-06 00:00 -> 01:00.
        let cal = Calendar::new(
            CalendarUnit::Day,
            TimeZone::get("America/Santiago").unwrap(),
        );
        let (s, e) = cal.bounds(at("2026-09-06T12:00:00Z"));
        assert_eq!(s, at("2026-09-06T04:00:00Z"));
        assert_eq!(e - s, 23 * H);
    }

    #[test]
    fn iso_week_and_month() {
        let utc = |u| Calendar::new(u, TimeZone::UTC);
        // 2026-11-22 is a Sunday: its ISO week began Monday 2026-11-16.
        let (s, e) = utc(CalendarUnit::Week).bounds(at("2026-11-22T10:00:00Z"));
        assert_eq!(
            (s, e),
            (at("2026-11-16T00:00:00Z"), at("2026-11-23T00:00:00Z"))
        );
        let (s, e) = utc(CalendarUnit::Month).bounds(at("2026-02-10T00:00:00Z"));
        assert_eq!(
            (s, e),
            (at("2026-02-01T00:00:00Z"), at("2026-03-01T00:00:00Z"))
        );
        assert_eq!(
            utc(CalendarUnit::Month).next_bounds(at("2026-12-31T23:00:00Z")),
            (at("2027-01-01T00:00:00Z"), at("2027-02-01T00:00:00Z"))
        );
    }

    #[test]
    fn half_hour_zone_hours() {
        let cal = Calendar::new(CalendarUnit::Hour, TimeZone::get("Asia/Kolkata").unwrap());
        let (s, e) = cal.bounds(at("2026-01-01T00:10:00Z"));
        assert_eq!(
            (s, e),
            (at("2025-12-31T23:30:00Z"), at("2026-01-01T00:30:00Z"))
        );
        assert_eq!(local_hour(&cal.tz, at("2026-01-01T00:10:00Z")), 5);
    }
}
