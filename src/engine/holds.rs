//! What a record remembers of the reservations that touched it, with a
//! shared store (docs/cluster.md): the open ones whose debits it holds and
//! the settled ones, until their deadlines. Plain data, a leaf of the engine:
//! `record.rs` keeps it, `placement/` reads and writes it (and says how a
//! held reservation's definitions are found, `impl Held` there).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::clock::Nanos;

/// What other nodes must see of a record's reservations.
#[derive(Debug, Clone, Default)]
pub(crate) struct SharedMeta {
    /// Open reservations with debits in this record.
    pub held: Vec<Held>,
    /// Ids settled or counted here, remembered until their deadline so a
    /// repeat on any node gets the same answer: settled reservations, and
    /// the ids of counted events (`events.rs`).
    pub remembered: Vec<RememberedId>,
}

impl SharedMeta {
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty() && self.remembered.is_empty()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        std::mem::size_of::<SharedMeta>()
            + self.held.capacity() * std::mem::size_of::<Held>()
            + self.remembered.capacity() * std::mem::size_of::<RememberedId>()
    }
}

/// An open reservation, as the record remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Held {
    /// The reservation id's hash (`Engine::res_of`): its pending debits'
    /// `res`.
    pub res: u64,
    pub deadline: Nanos,
    pub kind: HeldKind,
    /// The hash of the request that made it ([`super::request::body_hash`];
    /// 0 for a node-made id): a repeat under a caller's id on any node is
    /// the same reservation only with the same body. Stored after the
    /// rest of the record (`placement/form.rs`, `SharedForm`'s `bodies`), so records written
    /// before it existed still decode, and nodes that do not know it still
    /// read newer records.
    #[serde(skip)]
    pub body: u64,
    /// An inline check's limits (their JSON, ~60 bytes an item): owner 0
    /// names no definition another node could look up, so the record keeps
    /// what its debits were made under, and any node settles or expires
    /// them. Stored after the bodies (`SharedForm`), as they are.
    #[serde(skip)]
    pub inline: Option<Arc<[u8]>>,
    /// A screen's other identities' records that may hold its debits
    /// (keys of `super::identities`): a commit on any node settles them
    /// after this record. Stored after the inline limits, as they are.
    #[serde(skip)]
    pub ids: Vec<u128>,
    /// A screen's candidates' costs other than 1, by index: a node that
    /// commits the reservation without having made it charges the
    /// winners' campaign-side spend itself (docs/cluster.md, "Spend is
    /// reported"). Stored after the ids, as they are.
    #[serde(skip)]
    pub costs: Vec<(u32, u64)>,
    /// The process nonce of the node that made it, when its id does not
    /// say (a client-chosen id; 0 otherwise): a node that commits it tells
    /// that node at once ([`crate::store::LeaseCalls::notify`]). Stored with
    /// the costs.
    #[serde(skip)]
    pub maker: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum HeldKind {
    /// A check's, on the key of policy `policy`.
    Check { policy: u32 },
    /// A screen's eligible candidates: (index in the screen, campaign id).
    Screen { candidates: Vec<(u32, u32)> },
}

/// An id a record remembers until `deadline`, so that a repeat on any node
/// is answered as the first call was: a settled reservation's (how it
/// settled), or a counted event's (`committed`, no campaigns, no final
/// cost: `events.rs`), both keyed by the hash of their id. One type for
/// both because a record encodes them in one list (`placement/form.rs`,
/// `SharedForm`): a second list would change the stored layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RememberedId {
    pub res: u64,
    pub deadline: Nanos,
    pub committed: bool,
    /// The campaigns committed (ids), or released.
    pub campaigns: Vec<u32>,
    /// A commit's final cost, if it named one.
    pub final_cost: Option<u64>,
    /// A commit made on another node than the reservation's, which charged
    /// the winners' campaign-side spend itself (reported before it was
    /// acknowledged): the node that made the reservation gives its holds
    /// up rather than charging them. Stored after the held costs.
    #[serde(skip)]
    pub charged: bool,
}
