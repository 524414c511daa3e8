//! Errors and warnings of definitions: each names the field it is about.

use std::fmt;

/// A definition was rejected. `field` is a path into the definition as written,
/// e.g. `limits[1].burst`, so a user can find what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DefinitionError {
    /// Where: a dotted path with indexes (`limits[0].pacing.profile[3]`).
    pub field: String,
    /// What is wrong and, where it helps, what would be right.
    pub message: String,
}

impl DefinitionError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        DefinitionError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for DefinitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

/// Something accepted but probably not meant (e.g. two windows of the same
/// length). Returned beside the stored definition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Warning {
    pub field: String,
    pub message: String,
}
