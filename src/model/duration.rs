//! Duration strings of definitions: `<positive integer><unit>`, e.g. `"250ms"`, `"1d"`.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::clock::Nanos;

/// The units a duration string may end with. `Mo` (calendar month) is only valid
/// where a calendar period is meant (calendar windows and budgets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Millis,
    Seconds,
    Minutes,
    Hours,
    Days,
    Weeks,
    Months,
}

impl Unit {
    fn suffix(self) -> &'static str {
        match self {
            Unit::Millis => "ms",
            Unit::Seconds => "s",
            Unit::Minutes => "m",
            Unit::Hours => "h",
            Unit::Days => "d",
            Unit::Weeks => "w",
            Unit::Months => "mo",
        }
    }

    /// Length of one unit in nanoseconds; `None` for months, whose length depends
    /// on the calendar.
    fn nanos(self) -> Option<Nanos> {
        const S: Nanos = crate::clock::SECOND;
        Some(match self {
            Unit::Millis => crate::clock::MS,
            Unit::Seconds => S,
            Unit::Minutes => 60 * S,
            Unit::Hours => 3_600 * S,
            Unit::Days => 86_400 * S,
            Unit::Weeks => 7 * 86_400 * S,
            Unit::Months => return None,
        })
    }
}

/// The longest fixed duration accepted: 10 000 days (about 27 years). Keeping
/// durations below 2^60 ns leaves headroom for the exact products limit algorithms
/// form (cost × period fits in 128 bits with room to spare).
pub const MAX_DURATION: Nanos = 10_000 * 86_400 * crate::clock::SECOND;

/// A duration as written in a definition. It keeps the count and unit it was
/// written with, so a stored definition is returned exactly as it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Duration {
    /// The positive integer before the unit.
    pub count: u64,
    /// The unit after it.
    pub unit: Unit,
}

impl Duration {
    /// The length in nanoseconds, or `None` for a month count.
    pub fn nanos(&self) -> Option<Nanos> {
        // Parsing bounds count × unit by MAX_DURATION, so this cannot overflow.
        self.unit.nanos().map(|u| u * self.count)
    }

    /// If this duration is exactly one calendar hour, day, week or month, which one.
    pub fn calendar_unit(&self) -> Option<crate::limits::calendar::CalendarUnit> {
        use crate::limits::calendar::CalendarUnit as C;
        if self.count != 1 {
            return None;
        }
        match self.unit {
            Unit::Hours => Some(C::Hour),
            Unit::Days => Some(C::Day),
            Unit::Weeks => Some(C::Week),
            Unit::Months => Some(C::Month),
            _ => None,
        }
    }
}

/// Why a duration string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("expected <positive integer><ms|s|m|h|d|w|mo>, e.g. \"250ms\" or \"1d\", got {0:?}")]
    Syntax(String),
    #[error("must be positive, got {0:?}")]
    Zero(String),
    #[error("{0:?} is longer than the maximum of 10000 days")]
    TooLong(String),
}

impl FromStr for Duration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits = s.bytes().take_while(u8::is_ascii_digit).count();
        let (num, suffix) = s.split_at(digits);
        let unit = match suffix {
            "ms" => Unit::Millis,
            "s" => Unit::Seconds,
            "m" => Unit::Minutes,
            "h" => Unit::Hours,
            "d" => Unit::Days,
            "w" => Unit::Weeks,
            "mo" => Unit::Months,
            _ => return Err(DurationError::Syntax(s.to_owned())),
        };
        // Leading '+' or whitespace never reach here: only ASCII digits were taken.
        if num.is_empty() {
            return Err(DurationError::Syntax(s.to_owned()));
        }
        let count: u64 = num
            .parse()
            .map_err(|_| DurationError::TooLong(s.to_owned()))?;
        if count == 0 {
            return Err(DurationError::Zero(s.to_owned()));
        }
        let too_long = match unit.nanos() {
            Some(u) => count.checked_mul(u).is_none_or(|ns| ns > MAX_DURATION),
            // 10000 days is about 328 months.
            None => count > 328,
        };
        if too_long {
            return Err(DurationError::TooLong(s.to_owned()));
        }
        Ok(Duration { count, unit })
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.count, self.unit.suffix())
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[0-9]+(ms|s|m|h|d|w|mo)$",
            "description": "A positive integer and a unit: ms, s, m, h, d, w, or mo (calendar month; calendar windows and budgets only). At most 10000 days.",
            "examples": ["250ms", "1s", "5m", "1h", "1d", "1w", "1mo"]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        let cases = [
            ("250ms", 250_000_000),
            ("1s", 1_000_000_000),
            ("5m", 300_000_000_000),
            ("1h", 3_600_000_000_000),
            ("1d", 86_400_000_000_000),
            ("1w", 604_800_000_000_000),
        ];
        for (s, ns) in cases {
            let d: Duration = s.parse().unwrap();
            assert_eq!(d.nanos(), Some(ns), "{s}");
            assert_eq!(d.to_string(), s);
        }
        let mo: Duration = "1mo".parse().unwrap();
        assert_eq!(mo.nanos(), None);
    }

    #[test]
    fn rejects_malformed() {
        for s in [
            "", "1", "s", "0s", "-1s", "+1s", "1.5s", "1 s", "1h30m", "1y", "1S",
        ] {
            assert!(s.parse::<Duration>().is_err(), "{s:?} should fail");
        }
        assert!(matches!(
            "99999999999999999999d".parse::<Duration>(),
            Err(DurationError::TooLong(_))
        ));
        assert!(matches!(
            "10001d".parse::<Duration>(),
            Err(DurationError::TooLong(_))
        ));
        assert!("10000d".parse::<Duration>().is_ok());
    }
}
