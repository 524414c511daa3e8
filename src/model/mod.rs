//! Definitions: limits and policies as users write them, parsing (JSON, TOML),
//! validation with errors that name the field, and their JSON Schemas.

pub mod campaign;
pub mod duration;
pub mod error;
pub mod event_type;
pub mod identity;
pub mod limit;
mod raw;
mod word;

pub use campaign::{
    CampaignDef, CompiledCampaign, Day, FlightDef, HoursDef, ScheduleDef, Scope, UnknownUser,
};
pub use duration::Duration;
pub use error::{DefinitionError, Warning};
pub use event_type::EventType;
pub use identity::Kind;
pub use limit::{CompiledPolicy, Goal, LimitDef, Mode, PolicyDef};

use serde::de::DeserializeOwned;

/// Parses a definition from JSON. A syntax or type error names the field it is
/// in (`limits[0].rate`), as validation errors do.
/// The text must be one JSON value and nothing more: trailing bytes after it
/// (`{...} xyz`, or a second object) are an error, not ignored.
pub fn from_json<T: DeserializeOwned>(text: &str) -> Result<T, DefinitionError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut *de).map_err(|e| path_error(&e))?;
    de.end()
        .map_err(|e| DefinitionError::new("", format!("one JSON value expected: {e}")))?;
    Ok(value)
}

/// Refuses JSON in which an object gives a member twice (`{"limit": 3,
/// "limit": 5}`), naming where. Typed structs refuse that themselves, but
/// parts of a definition are first read as a plain JSON value (a campaign's
/// caps, budget and pacing), where the last member would silently win.
pub fn check_unique_members(text: &str) -> Result<(), DefinitionError> {
    use serde::de::{DeserializeSeed, Error, MapAccess, SeqAccess, Visitor};
    struct Unique;
    impl<'de> DeserializeSeed<'de> for Unique {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Unique {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while seq.next_element_seed(Unique)?.is_some() {}
            Ok(())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                if seen.contains(&key) {
                    return Err(A::Error::custom(format!("{key}: given twice")));
                }
                map.next_value_seed(Unique)?;
                seen.insert(key);
            }
            Ok(())
        }
    }
    struct Document;
    impl<'de> serde::Deserialize<'de> for Document {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(Unique).map(|()| Document)
        }
    }
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize::<_, Document>(&mut *de)
        .map(|_| ())
        .map_err(|e| path_error(&e))
}

/// Parses a definition from TOML, naming the field on error as [`from_json`] does.
pub fn from_toml<T: DeserializeOwned>(text: &str) -> Result<T, DefinitionError> {
    let de = toml::Deserializer::parse(text)
        .map_err(|e| DefinitionError::new("", format!("invalid TOML: {}", e.message())))?;
    serde_path_to_error::deserialize(de).map_err(|e| path_error(&e))
}

fn path_error<E: std::fmt::Display>(e: &serde_path_to_error::Error<E>) -> DefinitionError {
    let (field, message) = split_path(e.path(), e.inner().to_string());
    // serde_json appends " at line L column C"; keep it, it helps find the spot.
    DefinitionError::new(field, message)
}

/// The innermost field of an error: `path` joined with the path its message
/// may lead with.
///
/// Parts read through a `serde_json::Value` (a campaign's caps and budget, a
/// budget's pacing) deserialize on their own, out of the outer deserializer's
/// sight, so their errors can only come out as text; [`nested_error`] makes
/// that text `path: message` and this moves the path back where it belongs.
/// So does an item's own check ([`raw::FieldError`], `field: message`). serde's
/// own messages never start with a bare path and a colon ("invalid value:
/// ..." has a space).
fn split_path(path: &serde_path_to_error::Path, mut message: String) -> (String, String) {
    let path = path.to_string();
    // serde_path_to_error writes "." for the root.
    let mut field = if path == "." { String::new() } else { path };
    if let Some((sub, rest)) = message.split_once(": ")
        && sub.starts_with(|c: char| c.is_ascii_lowercase())
        && sub.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'[' | b']')
        })
    {
        field = if field.is_empty() {
            sub.to_owned()
        } else {
            format!("{field}.{sub}")
        };
        message = rest.to_owned();
    }
    (field, message)
}

/// Reads a part of a definition held as a `serde_json::Value`, reporting an
/// error inside it as `path: message` (`rate: invalid type: string "3", ...`),
/// which [`split_path`] joins to the outer path (`caps[0].rate`). `hint` leads
/// the message of an error about the value as a whole.
pub(crate) fn nested_error<T: DeserializeOwned, E: serde::de::Error>(
    value: serde_json::Value,
    hint: Option<&str>,
) -> Result<T, E> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let (field, message) = split_path(e.path(), e.inner().to_string());
        E::custom(match (field.is_empty(), hint) {
            (false, _) => format!("{field}: {message}"),
            (true, Some(h)) => format!("{h}: {message}"),
            (true, None) => message,
        })
    })
}

/// The JSON Schemas of the definitions, as (file name under `schemas/`, text).
/// `tests/schemas.rs` checks that the files in `schemas/` are these.
pub fn schemas() -> Vec<(&'static str, String)> {
    let render = |s: schemars::Schema| {
        let mut text = serde_json::to_string_pretty(&s).unwrap_or_default();
        text.push('\n');
        text
    };
    vec![
        ("limit.schema.json", render(schemars::schema_for!(LimitDef))),
        (
            "policy.schema.json",
            render(schemars::schema_for!(PolicyDef)),
        ),
        (
            "campaign.schema.json",
            render(schemars::schema_for!(CampaignDef)),
        ),
    ]
}
