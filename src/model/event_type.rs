//! Event types (docs/semantics.md §6.9, "Caps per event type"): what a cap
//! or budget counts. A commit is an impression; an event says its `type`
//! (`"click"`, `"conversion"`, default `"impression"`), and a cap with
//! `"event": "click"` counts only clicks.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::word::{MAX_WORD_LEN, Word};

/// An event type: a lowercase word, 1 to 16 of `a`–`z`, `0`–`9` and `_`,
/// starting with a letter. Inline and `Copy`: every item a decision walks
/// compares its own with the event's.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventType(Word);

impl EventType {
    /// What a commit counts, and an event without a `type`.
    pub const IMPRESSION: EventType = EventType(Word::from_static(b"impression"));

    /// A click, as `freqcap simulate` sends them (`ctr`).
    pub const CLICK: EventType = EventType(Word::from_static(b"click"));

    /// Reads an event type, saying what is wrong with one that is not.
    pub fn parse(s: &str) -> Result<EventType, String> {
        Word::parse(s).map(EventType).ok_or_else(|| {
            format!(
                "an event type is 1 to {MAX_WORD_LEN} lowercase letters, digits or '_', \
                 starting with a letter (\"impression\", \"click\"), got {s:?}"
            )
        })
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    pub fn is_impression(&self) -> bool {
        *self == EventType::IMPRESSION
    }
}

impl Default for EventType {
    fn default() -> Self {
        EventType::IMPRESSION
    }
}

impl fmt::Debug for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EventType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EventType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        EventType::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for EventType {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EventType".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "An event type: 1 to 16 lowercase letters, digits or '_', starting with a letter (\"impression\", the default, \"click\", \"conversion\").",
            "type": "string",
            "pattern": "^[a-z][a-z0-9_]{0,15}$"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_are_lowercase_words() {
        for good in ["impression", "click", "conversion", "video_view", "v2"] {
            assert_eq!(
                EventType::parse(good).map(|k| k.to_string()),
                Ok(good.into())
            );
        }
        for bad in [
            "",
            "Click",
            "2x",
            "_x",
            "click-through",
            "abcdefghijklmnopq",
        ] {
            let e = EventType::parse(bad).unwrap_err();
            assert!(e.contains("event type"), "{bad:?}: {e}");
        }
        assert!(EventType::parse("impression").unwrap().is_impression());
        assert!(!EventType::parse("click").unwrap().is_impression());
        assert_eq!(EventType::default(), EventType::IMPRESSION);
    }
}
