//! A request's priority class as every front reads it (docs/semantics.md
//! §2.5): a field of the request (JSON `priority`, gRPC's `priority`, RESP's
//! `PRIORITY p`) and, for callers that cannot change the body (a proxy, a
//! mesh), the header or metadata [`HEADER`]. Absent: `default`.

use crate::engine::Priority;

use super::FrontError;

/// The header (HTTP) and metadata key (gRPC, RLS) a class may come in.
pub const HEADER: &str = "x-freqcap-priority";

/// The [`HEADER`] of an HTTP request, if sent.
pub fn header(headers: &axum::http::HeaderMap) -> Option<&[u8]> {
    headers.get(HEADER).map(|v| v.as_bytes())
}

/// Reads a class word; the error names `field` and lists the classes.
pub fn parse(field: &str, word: &str) -> Result<Priority, FrontError> {
    Priority::parse(word).ok_or_else(|| FrontError::invalid(field, Priority::expected(word)))
}

/// [`of_request`] with the field still a word (gRPC's and the client's
/// `optional string`).
pub fn of_word(field: Option<&str>, header: Option<&[u8]>) -> Result<Priority, FrontError> {
    let field = field.map(|w| parse("priority", w)).transpose()?;
    of_request(field, header)
}

/// The request's class from its field and its header, either of which may
/// be absent. Both given and different is the client's error: silently
/// preferring one would decide a request at a class its sender did not mean.
pub fn of_request(field: Option<Priority>, header: Option<&[u8]>) -> Result<Priority, FrontError> {
    let header = match header {
        Some(h) => {
            let word = std::str::from_utf8(h)
                .map_err(|_| FrontError::invalid(HEADER, "must be a class word in ASCII"))?;
            Some(parse(HEADER, word.trim())?)
        }
        None => None,
    };
    match (field, header) {
        (Some(f), Some(h)) if f != h => Err(FrontError::invalid(
            "priority",
            format!(
                "the request says {:?} and the {HEADER} header {:?}: give one, or the same",
                f.as_str(),
                h.as_str()
            ),
        )),
        (f, h) => Ok(f.or(h).unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_header_and_their_disagreement() {
        assert_eq!(of_request(None, None).unwrap(), Priority::Default);
        assert_eq!(of_request(None, Some(b"low")).unwrap(), Priority::Low);
        assert_eq!(
            of_request(Some(Priority::Critical), Some(b" critical ")).unwrap(),
            Priority::Critical
        );
        let e = of_request(Some(Priority::High), Some(b"low")).unwrap_err();
        assert!(e.message.starts_with("priority: "), "{}", e.message);
        let e = of_request(None, Some(b"urgent")).unwrap_err();
        assert!(
            e.message.starts_with("x-freqcap-priority: must be one of"),
            "{}",
            e.message
        );
        assert!(of_request(None, Some(&[0xff])).is_err());
    }
}
