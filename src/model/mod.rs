//! Definitions: limits and policies as users write them, parsing (JSON, TOML),
//! validation with errors that name the field, and their JSON Schemas.

pub mod campaign;
pub mod duration;
pub mod error;
pub mod limit;
mod raw;

pub use campaign::{CampaignDef, CompiledCampaign, Scope, UnknownUser};
pub use duration::Duration;
pub use error::{DefinitionError, Warning};
pub use limit::{CompiledPolicy, LimitDef, PolicyDef};

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

/// Parses a definition from TOML, naming the field on error as [`from_json`] does.
pub fn from_toml<T: DeserializeOwned>(text: &str) -> Result<T, DefinitionError> {
    let de = toml::Deserializer::parse(text)
        .map_err(|e| DefinitionError::new("", format!("invalid TOML: {}", e.message())))?;
    serde_path_to_error::deserialize(de).map_err(|e| path_error(&e))
}

fn path_error<E: std::fmt::Display>(e: &serde_path_to_error::Error<E>) -> DefinitionError {
    let path = e.path().to_string();
    // serde_path_to_error writes "." for the root.
    let mut field = if path == "." { String::new() } else { path };
    let mut message = e.inner().to_string();
    // An item's own check (raw::FieldError) says which of its fields is wrong as
    // "field: message"; move that field into the path. serde's own messages never
    // start with a bare identifier and a colon ("invalid value: ..." has a space).
    if let Some((sub, rest)) = message.split_once(": ")
        && !sub.is_empty()
        && sub.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
    {
        field = if field.is_empty() {
            sub.to_owned()
        } else {
            format!("{field}.{sub}")
        };
        message = rest.to_owned();
    }
    // serde_json appends " at line L column C"; keep it, it helps find the spot.
    DefinitionError::new(field, message)
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
