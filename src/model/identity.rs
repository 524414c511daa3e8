//! Identity kinds (docs/semantics.md §6.2, "Identity scopes"): what a cap
//! counts per. A screen, an event or a usage read names the viewer by one
//! or more identities (`"ids": {"user": "u1", "household": "h7"}`); a cap
//! with `"scope": "household"` counts on the household's record.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::word::Word;

/// The longest identity kind, in bytes: kept inline (a cap's scope is
/// `Copy` and compared on every decision), 17 bytes with its length.
pub const MAX_KIND_LEN: usize = super::word::MAX_WORD_LEN;

/// The most identities one request may name (`user` included): each is a
/// record read, and a lock or a Redis round trip, per screen.
pub const MAX_IDS: usize = 8;

/// An identity kind: a lowercase word, 1 to 16 of `a`–`z`, `0`–`9` and `_`,
/// starting with a letter; `campaign` is not one (it is a cap's other
/// scope). `user` is the kind a request's `user` field names.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kind(Word);

impl Kind {
    /// The `user` kind.
    pub const USER: Kind = Kind(Word::from_static(b"user"));

    /// Reads a kind, saying what is wrong with one that is not.
    pub fn parse(s: &str) -> Result<Kind, String> {
        let Some(w) = Word::parse(s) else {
            return Err(format!(
                "an identity kind is 1 to {MAX_KIND_LEN} lowercase letters, digits or '_', \
                 starting with a letter, got {s:?}"
            ));
        };
        if s == "campaign" {
            return Err("\"campaign\" is a cap's scope, not an identity kind".into());
        }
        Ok(Kind(w))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    pub fn is_user(&self) -> bool {
        *self == Kind::USER
    }
}

impl fmt::Debug for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Kind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Kind::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Kind {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "IdentityKind".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "An identity kind: 1 to 16 lowercase letters, digits or '_', starting with a letter; not \"campaign\".",
            "type": "string",
            "pattern": "^[a-z][a-z0-9_]{0,15}$",
            "not": {"const": "campaign"}
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_lowercase_words_other_than_campaign() {
        for good in [
            "user",
            "household",
            "device",
            "a",
            "hh_2",
            "abcdefghijklmnop",
        ] {
            assert_eq!(Kind::parse(good).map(|k| k.to_string()), Ok(good.into()));
        }
        for bad in [
            "",
            "Household",
            "2fa",
            "_x",
            "house-hold",
            "abcdefghijklmnopq",
            "campaign",
            "é",
        ] {
            assert!(Kind::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Kind::parse("user").is_ok_and(|k| k.is_user()));
        assert_eq!(Kind::USER.as_str(), "user");
    }
}
