//! One caller per region (docs/regions.md, "One caller per region"): the
//! region's board, a record in the region's Redis, names the node that
//! renews the region's grants at the global tier and holds what the tier
//! last granted for each item. The other nodes of the region adopt the
//! board's grants instead of asking the tier themselves, so the tier gets
//! one call per item and second per region whatever its number of nodes.
//!
//! - A node is its region's caller while the board names it, or once the
//!   named caller's claim has lapsed ([`CALLER_TTL`], renewed every tick):
//!   a caller that stops is replaced within seconds, while the grants it
//!   last published stay usable for 24 s.
//! - An item a node follows that the board does not hold yet, the node
//!   renews itself that tick, and adds to the board as an ask: the caller
//!   renews it from its next tick on.
//! - Two nodes that both find the claim lapsed both renew that tick (the
//!   tier's counts are absolute: nothing is granted twice); the first to
//!   write the board is the caller, the other yields.

use std::collections::HashMap;

use crate::clock::Nanos;
use crate::store::{Cas, Shared, StoreError};

use super::{GrantKey, Leased};

/// How long a caller's claim lasts past its last tick (it ticks every
/// second): a caller gone is replaced within this, long before its last
/// grants (usable 24 s) run out.
pub(crate) const CALLER_TTL: Nanos = 5_000_000_000;

/// The board's record key in the region's store (`fc:{g:...}` in Redis).
pub(crate) const BOARD_KEY: &[u8] = b"gregion-board";

/// How long the board lives unwritten (a region whose nodes all stopped).
const BOARD_KEEP: Nanos = 86_400_000_000_000;

/// Writes of the board tried per tick when others write it meanwhile.
const WRITE_TRIES: usize = 3;

/// The board's format.
const FORMAT: u8 = 1;

/// One item's grant to the region, as the caller last heard it (the
/// fields of `regions.rs`'s `RegionGrant`, all times the cluster's).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BoardItem {
    pub granted: u64,
    pub usable_until: Nanos,
    pub spent: u64,
    pub read_at: Nanos,
    pub want: u64,
    pub total: u64,
    pub end: Nanos,
}

/// The region's board: its caller, until when, and every item's grant.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Board {
    pub caller: String,
    pub until: Nanos,
    pub items: HashMap<GrantKey, BoardItem>,
}

impl Board {
    /// Whether `me` calls the tier for the region this tick.
    pub(crate) fn calls(&self, me: &str, now: Nanos) -> bool {
        self.caller == me || self.until <= now
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(16 + self.caller.len() + self.items.len() * 72);
        v.push(FORMAT);
        let name = &self.caller.as_bytes()[..self.caller.len().min(u16::MAX as usize)];
        v.extend_from_slice(&(name.len() as u16).to_be_bytes());
        v.extend_from_slice(name);
        v.extend_from_slice(&self.until.to_be_bytes());
        // Campaign items only (the only ones leased across regions).
        let items: Vec<_> = self
            .items
            .iter()
            .filter_map(|(k, i)| match k.0 {
                Leased::Campaign(id) => Some((id, k.1, k.2, i)),
                Leased::Key { .. } => None,
            })
            .collect();
        v.extend_from_slice(&(items.len() as u32).to_be_bytes());
        for (id, tag, start, i) in items {
            v.extend_from_slice(&id.to_be_bytes());
            v.extend_from_slice(&tag.to_be_bytes());
            for n in [
                start,
                i.granted,
                i.usable_until,
                i.spent,
                i.read_at,
                i.want,
                i.total,
                i.end,
            ] {
                v.extend_from_slice(&n.to_be_bytes());
            }
        }
        v
    }

    fn decode(b: &[u8]) -> Option<Board> {
        let mut r = Reader(b);
        if r.take(1)?[0] != FORMAT {
            return None;
        }
        let n = u16::from_be_bytes(r.take(2)?.try_into().ok()?) as usize;
        let caller = String::from_utf8(r.take(n)?.to_vec()).ok()?;
        let until = r.u64()?;
        let count = u32::from_be_bytes(r.take(4)?.try_into().ok()?) as usize;
        let mut items = HashMap::with_capacity(count.min(b.len() / 72));
        for _ in 0..count {
            let id = u32::from_be_bytes(r.take(4)?.try_into().ok()?);
            let tag = u32::from_be_bytes(r.take(4)?.try_into().ok()?);
            let start = r.u64()?;
            let item = BoardItem {
                granted: r.u64()?,
                usable_until: r.u64()?,
                spent: r.u64()?,
                read_at: r.u64()?,
                want: r.u64()?,
                total: r.u64()?,
                end: r.u64()?,
            };
            items.insert((Leased::Campaign(id), tag, start), item);
        }
        r.0.is_empty().then_some(Board {
            caller,
            until,
            items,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// The board as read, and its version (0: none yet). A board that cannot
/// be read (another build's format) is taken as none: the next caller
/// writes it anew.
pub(crate) fn read(shared: &dyn Shared) -> Result<(u64, Board), StoreError> {
    Ok(match shared.read(BOARD_KEY)? {
        Some((version, bytes)) => (version, Board::decode(&bytes).unwrap_or_default()),
        None => (0, Board::default()),
    })
}

/// Writes the board `make` builds from the board as it stands (first the
/// one read at `version`), trying again on a board another node wrote
/// meanwhile; `make` answers `None` to write nothing. Returns whether it
/// was written.
pub(crate) fn write(
    shared: &dyn Shared,
    (mut version, mut board): (u64, Board),
    now: Nanos,
    mut make: impl FnMut(&Board) -> Option<Board>,
) -> Result<bool, StoreError> {
    for _ in 0..WRITE_TRIES {
        let Some(next) = make(&board) else {
            return Ok(false);
        };
        match shared.cas(
            BOARD_KEY,
            version,
            &next.encode(),
            now.saturating_add(BOARD_KEEP),
        )? {
            Cas::Written(_) => return Ok(true),
            Cas::Conflict { version: v, value } => {
                version = v;
                board = value.as_deref().and_then(Board::decode).unwrap_or_default();
            }
            // A hot key's freeze: never this record.
            _ => return Ok(false),
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_board_reads_back_as_written() {
        let mut b = Board {
            caller: "n1/7".into(),
            until: 42,
            items: HashMap::new(),
        };
        for i in 0..3u32 {
            b.items.insert(
                (Leased::Campaign(i), i * 2, u64::from(i) * 10),
                BoardItem {
                    granted: 1,
                    usable_until: 2,
                    spent: 3,
                    read_at: 4,
                    want: 5,
                    total: u64::MAX,
                    end: 7,
                },
            );
        }
        assert_eq!(Board::decode(&b.encode()), Some(b.clone()));
        // Truncated or longer: not a board.
        let bytes = b.encode();
        assert_eq!(Board::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(Board::decode(&[bytes.as_slice(), &[0]].concat()), None);
        assert_eq!(Board::decode(&[]), None);
    }

    #[test]
    fn a_lapsed_claim_passes_to_whoever_ticks() {
        let b = Board {
            caller: "a".into(),
            until: 100,
            ..Board::default()
        };
        assert!(b.calls("a", 99));
        assert!(!b.calls("b", 99));
        assert!(b.calls("b", 100));
        assert!(Board::default().calls("b", 0));
    }
}
