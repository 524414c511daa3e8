//! freqcap: frequency capping and rate limiting with exact limits, stacked
//! decisions and reservations.
//!
//! Where things are:
//! - [`clock`]: time as the engine sees it (injected, never backwards).
//! - [`limits`]: the algorithms, pure state machines: where a limit is decided.
//! - [`model`]: definitions as users write them, validated and compiled.
//! - [`front`]: what every front shares: state, the one error, tokens,
//!   shedding, engine calls, decision labels.
//! - [`api`]: where HTTP enters: the axum router and its bodies.
//! - [`rls`]: where Envoy's rate limit service enters (on the gRPC listener).
//! - [`resp`]: where the Redis protocol enters: `CL.THROTTLE`, `FC.CHECK`.
//! - [`grpc`]: where gRPC enters: `freqcap.v1.Freqcap`, health, reflection.
//! - `client` (feature `client`): a Rust client of the HTTP API that retries
//!   only where safe, backs off with jitter and throttles itself.
//! - `tower` (feature `tower`): a tower layer limiting an HTTP service.
//! - [`engine`]: the decision core: campaigns, screening, reservations,
//!   commits, the hot tier.
//! - [`store`]: where state is kept: memory or RocksDB.
//! - [`service`]: `freqcap serve`: configuration and the server's life.
//! - [`replay`]: the API on a virtual clock, line by line.
//! - [`simulate`]: `freqcap simulate`: pacing on a virtual day, with a report.
//! - [`keyed`]: a concurrent, memory-bounded map from key to limit state, and the
//!   [`KeyedLimiter`] built on it.

/// The largest integer freqcap takes or reports: 2^53 − 1, the largest a
/// JSON reader holding numbers as doubles represents exactly. Costs, limits
/// and counts in definitions, and every figure an answer reports, are at
/// most this (docs/semantics.md §1.3), and the JSON Schemas say so.
pub const MAX_EXACT: u64 = (1 << 53) - 1;

pub mod api;
#[cfg(feature = "client")]
pub mod client;
pub mod clock;
pub mod cluster;
pub mod definitions_dir;
pub mod engine;
pub mod front;
pub mod grpc;
pub mod keyed;
pub mod limits;
pub mod model;
pub mod replay;
pub mod resp;
pub mod rls;
pub mod server;
pub mod service;
pub mod simulate;
pub mod store;
pub mod tls;
#[cfg(feature = "tower")]
pub mod tower;

pub use clock::{Clock, ManualClock, Nanos, SystemClock};
pub use keyed::{KeyedLimiter, LimiterOptions};
pub use limits::stack::{Decision, Pending, Stack, Verdict};
pub use limits::{Hold, ItemFigures};
pub use model::{DefinitionError, LimitDef, PolicyDef};

// README's examples are compiled and run as doctests, so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
