//! Fields a `ShouldRateLimit` request carries that this server does not
//! know, found in its bytes before they are decoded (prost drops unknown
//! fields silently). Envoy adds fields that change what a call means:
//! 1.38's `is_negative_hits` turns a descriptor's hits into a refund, which
//! a server on an older proto would have debited (freqcap's credits it
//! back, docs/rls.md "Reports and refunds"). A request with a field
//! this server does not know is refused (INVALID_ARGUMENT naming where),
//! so that no field it cannot read can ever become a debit
//! (docs/rls.md, "Fields freqcap does not know").
//!
//! The walk knows the request's shape (`schemas/envoy/`): each message's
//! field numbers and which of them are messages to walk into.

/// A message's fields: (number, the message it holds, if any).
type Shape = &'static [(u64, Option<Kind>)];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Request,
    Descriptor,
    Entry,
    Override,
    UInt64Value,
}

impl Kind {
    fn shape(self) -> Shape {
        match self {
            // domain, descriptors, hits_addend.
            Kind::Request => &[(1, None), (2, Some(Kind::Descriptor)), (3, None)],
            // entries, limit, hits_addend, is_negative_hits.
            Kind::Descriptor => &[
                (1, Some(Kind::Entry)),
                (2, Some(Kind::Override)),
                (3, Some(Kind::UInt64Value)),
                (4, None),
            ],
            // key, value.
            Kind::Entry => &[(1, None), (2, None)],
            // requests_per_unit, unit.
            Kind::Override => &[(1, None), (2, None)],
            Kind::UInt64Value => &[(1, None)],
        }
    }

    /// The field's name in errors, as the API documents it.
    fn field(self, n: u64) -> &'static str {
        match (self, n) {
            (Kind::Request, 2) => "descriptors",
            (Kind::Descriptor, 1) => "entries",
            (Kind::Descriptor, 2) => "limit",
            (Kind::Descriptor, 3) => "hits_addend",
            _ => "",
        }
    }
}

/// Where in a `RateLimitRequest`'s bytes the first field this server does
/// not know is (`descriptors[0]: field 5`), or `None`. Bytes that are not a
/// well-formed message are left to the decoder, which refuses them.
pub fn unknown_field(bytes: &[u8]) -> Option<String> {
    walk(bytes, Kind::Request, "", 0).err().flatten()
}

/// `Err(Some(path))`: an unknown field; `Err(None)`: malformed (the
/// decoder's to refuse).
fn walk(mut b: &[u8], kind: Kind, path: &str, depth: u32) -> Result<(), Option<String>> {
    // The request nests four deep; more is not this request.
    if depth > 8 {
        return Err(None);
    }
    // Repeated message fields, counted for the path.
    let mut seen = [0usize; 8];
    while !b.is_empty() {
        let tag = varint(&mut b).ok_or(None)?;
        let (number, wire) = (tag >> 3, tag & 7);
        let Some(&(_, inner)) = kind.shape().iter().find(|(n, _)| *n == number) else {
            let at = if path.is_empty() {
                String::new()
            } else {
                format!("{path}: ")
            };
            return Err(Some(format!("{at}field {number}")));
        };
        match wire {
            0 => {
                varint(&mut b).ok_or(None)?;
            }
            1 => b = b.get(8..).ok_or(None)?,
            5 => b = b.get(4..).ok_or(None)?,
            2 => {
                let len = usize::try_from(varint(&mut b).ok_or(None)?).map_err(|_| None)?;
                let body = b.get(..len).ok_or(None)?;
                b = &b[len..];
                if let Some(k) = inner {
                    let i = usize::try_from(number).ok().and_then(|n| seen.get_mut(n));
                    let index = i.map_or(0, |c| {
                        *c += 1;
                        *c - 1
                    });
                    let name = kind.field(number);
                    let here = match (path.is_empty(), k) {
                        (_, Kind::Descriptor | Kind::Entry) if path.is_empty() => {
                            format!("{name}[{index}]")
                        }
                        (_, Kind::Descriptor | Kind::Entry) => format!("{path}.{name}[{index}]"),
                        (true, _) => name.to_owned(),
                        (false, _) => format!("{path}.{name}"),
                    };
                    walk(body, k, &here, depth + 1)?;
                }
            }
            _ => return Err(None),
        }
    }
    Ok(())
}

/// A protobuf varint, advancing `b`.
fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rls::pb::RateLimitRequest;
    use crate::rls::pb::{RateLimitDescriptor, rate_limit_descriptor::Entry};
    use prost::Message;

    fn request() -> RateLimitRequest {
        RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "client".into(),
                    value: "a".into(),
                }],
                hits_addend: Some(3),
                is_negative_hits: true,
                ..Default::default()
            }],
            hits_addend: 2,
        }
    }

    #[test]
    fn known_fields_pass_and_unknown_ones_are_named_where_they_are() {
        let mut bytes = request().encode_to_vec();
        assert_eq!(unknown_field(&bytes), None);
        // A field 9 (varint) at the request's level.
        bytes.extend_from_slice(&[9 << 3, 1]);
        assert_eq!(unknown_field(&bytes).as_deref(), Some("field 9"));
        // A field 5 inside the second descriptor.
        let r = request();
        let mut d = r.descriptors[0].encode_to_vec();
        d.extend_from_slice(&[5 << 3, 1]);
        // The request with one descriptor, then a second one with the
        // extra field.
        let mut bytes = r.encode_to_vec();
        bytes.push(2 << 3 | 2);
        bytes.push(u8::try_from(d.len()).unwrap());
        bytes.extend_from_slice(&d);
        assert_eq!(
            unknown_field(&bytes).as_deref(),
            Some("descriptors[1]: field 5")
        );
        // Malformed bytes are the decoder's to refuse.
        assert_eq!(unknown_field(&[0xff]), None);
    }
}
