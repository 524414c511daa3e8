//! Identity kinds (docs/semantics.md §6.2, "Identity scopes"): what a cap
//! counts per. A screen, an event or a usage read names the viewer by one
//! or more identities (`"ids": {"user": "u1", "household": "h7"}`); a cap
//! with `"scope": "household"` counts on the household's record.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest identity kind, in bytes: kept inline (a cap's scope is
/// `Copy` and compared on every decision), 17 bytes with its length.
pub const MAX_KIND_LEN: usize = 16;

/// The most identities one request may name (`user` included): each is a
/// record read, and a lock or a Redis round trip, per screen.
pub const MAX_IDS: usize = 8;

/// An identity kind: a lowercase word, 1 to 16 of `a`–`z`, `0`–`9` and `_`,
/// starting with a letter; `campaign` is not one (it is a cap's other
/// scope). `user` is the kind a request's `user` field names.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kind {
    len: u8,
    bytes: [u8; MAX_KIND_LEN],
}

impl Kind {
    /// The `user` kind.
    pub const USER: Kind = Kind::from_static(b"user");

    const fn from_static(s: &[u8]) -> Kind {
        let mut bytes = [0; MAX_KIND_LEN];
        let mut i = 0;
        while i < s.len() {
            bytes[i] = s[i];
            i += 1;
        }
        Kind {
            len: s.len() as u8,
            bytes,
        }
    }

    /// Reads a kind, saying what is wrong with one that is not.
    pub fn parse(s: &str) -> Result<Kind, String> {
        let b = s.as_bytes();
        let ok = (1..=MAX_KIND_LEN).contains(&b.len())
            && b[0].is_ascii_lowercase()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_');
        if !ok {
            return Err(format!(
                "an identity kind is 1 to {MAX_KIND_LEN} lowercase letters, digits or '_', \
                 starting with a letter, got {s:?}"
            ));
        }
        if s == "campaign" {
            return Err("\"campaign\" is a cap's scope, not an identity kind".into());
        }
        let mut bytes = [0; MAX_KIND_LEN];
        bytes[..b.len()].copy_from_slice(b);
        Ok(Kind {
            len: b.len() as u8,
            bytes,
        })
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII is ever stored (`parse`).
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
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
