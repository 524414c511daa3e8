//! The Redis Cluster store (docs/cluster.md): several freqcap nodes share
//! their state through a Redis Cluster (or, for development, one Redis).
//!
//! Layout (every key starts `fc:`; braces make the hash slot):
//! - `fc:{u:<32 hex>}`, `fc:{k:<32 hex>}`: a user's or a policy key's record,
//!   a hash `v` (version) + `b` (the record, [`crate::engine`]'s shared form),
//!   written only through `fc_cas_v1` (src/cluster/functions.lua), expiring
//!   at the record's idle instant plus a margin.
//! - `fc:{e:<32 hex>}`: an event id seen within the dedupe horizon.
//! - `fc:{defs}`: definitions (field = the definition's key), `__v` their
//!   version, `__ids` the id counter; changed only by `fc_defs_v1`, a batch
//!   at a time, all or nothing.
//! - `fc:{defs}:writer`: the node that writes its definitions directory
//!   (`fc_writer_v1`), expiring unless renewed.
//! - `fc:{t:<campaign id>}:<day>`: a campaign's timeline, one hash per UTC
//!   day (field `<minute>:s|c|d`: spend, commits, denied), each node adding
//!   its counts with `HINCRBY`; expiring with the timeline's retention.
//! - `fc:{tops}:<day>`: a sorted set of the campaigns' activity (commits
//!   and denials) on a UTC day, kept two days: today's and yesterday's pick
//!   the campaigns `/metrics` exports on every node.
//! - `fc:{meta}`: the key-hashing secret (set once, by the first node).
//!
//! Every call has a deadline ([`RedisOptions::call_timeout`]); the client
//! retries a failed connection once and never sleeps between tries, so a
//! dead shard fails only the requests for its keys, fast (the crate's
//! default, 16 retries with backoff, stalled every request for ~5 s in the
//! prototype; docs/cluster.md). A write whose answer is lost may have been
//! applied; the engine then reads the record again before deciding on it.
//!
//! Where each part lives: `conn.rs` the connection and its calls;
//! `records.rs` records by compare-and-set, and owner mode's claims, fenced
//! writes and members; `leases.rs` lease calls and the nodes' mailboxes;
//! `catalog.rs` definitions, timelines and activity (and the plain
//! [`crate::store::Store`] side); [`owners`] who owns which user, placed
//! with bounded loads by [`bounded`];
//! [`time`] the cluster's clock. Each implements one of the store's feature
//! traits ([`crate::store::shared`]).

pub mod bounded;
pub mod owners;
pub mod time;

mod catalog;
mod conn;
mod leases;
mod options;
mod records;
mod travel;

pub use conn::{RedisStore, START_RETRY, START_WAIT};
pub use options::{RedisOptions, Secret};

/// The Functions library, loaded at start with `FUNCTION LOAD REPLACE`.
pub const FUNCTIONS: &str = include_str!("functions.lua");

const DEFS: &str = "fc:{defs}";
const META: &str = "fc:{meta}";
/// Fields of [`DEFS`] that are not definitions.
const DEFS_VERSION: &str = "__v";
const DEFS_IDS: &str = "__ids";
/// The definitions-writer lock (the slot of [`DEFS`]).
const DEFS_WRITER: &str = "fc:{defs}:writer";
/// Owner mode's members and their leases (`fc_member_v1`).
const MEMBERS_KEY: &str = "fc:{members}";

/// Owner mode's loads: each node's report and the tables of heavy users
/// (`fc_heat_v1`); beside the members (same slot), not in their hash, which
/// every renewal reads whole.
const HEAT_KEY: &str = "fc:{members}:heat";
/// The mailbox of the node of process nonce `nonce`: notices of its
/// reservations other nodes settled.
fn mailbox_key(nonce: u32) -> String {
    format!("fc:{{m:{nonce:08x}}}")
}

/// The campaigns' activity on a UTC day, for `/metrics`' most active ones.
fn tops_key(day: u64) -> String {
    format!("fc:{{tops}}:{day}")
}
/// A day in minutes: a timeline's hash holds one UTC day.
const DAY_MINUTES: u64 = 1440;

/// The hash of campaign `id`'s timeline on day `day` (days since the epoch).
fn timeline_key(id: u32, day: u64) -> String {
    format!("fc:{{t:{id}}}:{day}")
}

/// The fields of a timeline minute: spend, commits, denied.
const TIMELINE_FIELDS: [&str; 3] = ["s", "c", "d"];
