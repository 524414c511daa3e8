//! What every front shares, under the wire formats: HTTP (`src/api/`),
//! gRPC (`src/grpc/`), RESP (`src/resp/`), Envoy's rate limit service
//! (`src/rls/`) and the in-process tower layer (`src/tower.rs`) translate
//! their messages and call this layer; none imports another front.
//!
//! - [`AppState`] and [`FrontOptions`]: the engine, the limits and tokens,
//!   the metrics and the body memory budget, one of each per process;
//! - [`error`]: the one error, a [`Code`] with its HTTP status, gRPC code
//!   and RESP word;
//! - [`access`]: who may call what, from a bearer token;
//! - [`shed`]: the in-flight cap and queue-delay shedding;
//! - [`call`]: the engine calls, in memory or on a blocking thread;
//! - [`outcome`]: the one label of a decision in `freqcap_decisions_total`;
//! - [`report`]: a check's figures as every front reports them;
//! - [`metrics`] (the counters kept as requests happen) and
//!   [`figures`](mod@figures) (what `/metrics` reads from the engine at
//!   scrape time), [`body_budget`], [`request_id`], [`ratelimit_fields`] (the
//!   `RateLimit` header fields HTTP, tower and RLS answer) and [`forward`]
//!   (owner mode: requests about other nodes' users go there).

pub mod access;
pub mod admission;
pub mod body_budget;
pub mod call;
pub mod cpu;
pub mod error;
pub mod figures;
pub mod forward;
pub mod metrics;
pub mod outcome;
pub mod priority;
pub mod ratelimit_fields;
pub mod report;
pub mod request_id;
pub mod sample;
pub mod shed;
pub mod trace;

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::engine::Engine;
use crate::server::ConnCounters;

pub use access::Access;
pub use error::{Code, FrontError};
pub use metrics::Metrics;

/// The time a request may take to send its body.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Limits and credentials of every front (HTTP, gRPC, RESP, Envoy's rate
/// limit service): one set, so a limit means the same whichever front a
/// request comes in by.
#[derive(Debug, Clone)]
pub struct FrontOptions {
    /// Largest request body, bytes (larger: 413 `too_large`).
    pub max_body: usize,
    /// Bytes of request bodies being received at once, every front and
    /// connection together ([`body_budget`]); past it 503
    /// `overloaded`. At least `max_body`.
    pub body_memory: usize,
    /// Requests handled at once; past it, 503 `overloaded` at once.
    pub max_in_flight: usize,
    /// Bearer token for decisions (check, screen, commit, release, events,
    /// usage); `None`: open.
    pub decision_token: Option<String>,
    /// Bearer token for definitions (policies, campaigns) and admin endpoints;
    /// `None`: open.
    pub admin_token: Option<String>,
    /// Whether `"wait": true` on a delayed check sleeps (replay never does).
    pub sleep_on_wait: bool,
    /// A request whose connection waited longer than this to be run is
    /// answered 503 `overloaded` at once; while the queue stands, a quarter
    /// of it (CoDel's target; [`shed`]).
    pub shed_queue_delay: std::time::Duration,
    /// The CPU guard: past this many thousandths of the process's CPUs
    /// busy, `low` and `sheddable` requests are shed; 0: off.
    pub shed_cpu_permille: u64,
    /// Past `max_in_flight`, a decision waits for a slot within its queue
    /// bound ([`shed::admit`]: adaptive LIFO) instead of 503 at once. Off
    /// by default: it helps callers that resend at once and costs CPU under
    /// sustained open-loop overload (docs/service.md, "Adaptive LIFO").
    pub in_flight_wait: bool,
    /// How long a request may take to send its body: past it, 408.
    pub body_timeout: std::time::Duration,
    /// `Some`: only these `Host` names (and loopback ones) are answered
    /// (the service sets it when it listens on loopback); `None`: any.
    pub allowed_hosts: Option<Vec<String>>,
    /// Where `POST /v1/admin/checkpoint` may write; `None`: checkpoints off.
    pub backup_dir: Option<std::path::PathBuf>,
    /// The listener's figures, exported with the others.
    pub connections: ConnCounters,
    /// Campaigns and policies whose own series `/metrics` exports, and how
    /// many of the most active others (docs/service.md, "Per-definition
    /// metrics").
    pub metrics_definitions: Vec<String>,
    pub metrics_top: usize,
    /// Owner mode over TLS: the client side of forwarding to other nodes
    /// (`crate::tls::peer_client`); `None`: plaintext.
    pub peer_tls: Option<Arc<rustls::ClientConfig>>,
    /// TLS's figures, registered in `/metrics` (the listeners' TLS counts
    /// into them).
    pub tls_counters: crate::tls::TlsCounters,
    /// How rate-limit header fields are named, on HTTP and in Envoy's
    /// rate limit answers (`ratelimit_fields::HeaderStyle`).
    pub header_style: ratelimit_fields::HeaderStyle,
}

impl Default for FrontOptions {
    fn default() -> Self {
        FrontOptions {
            max_body: 1 << 20,
            body_memory: DEFAULT_BODY_MEMORY,
            max_in_flight: 4096,
            decision_token: None,
            admin_token: None,
            sleep_on_wait: true,
            shed_queue_delay: std::time::Duration::from_millis(20),
            shed_cpu_permille: 950,
            in_flight_wait: false,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            allowed_hosts: None,
            backup_dir: None,
            connections: ConnCounters::default(),
            metrics_definitions: Vec::new(),
            metrics_top: 0,
            peer_tls: None,
            tls_counters: Default::default(),
            header_style: Default::default(),
        }
    }
}

/// The default of [`FrontOptions::body_memory`]: 64 bodies of the default
/// `max_body` (1 MiB) at once.
pub const DEFAULT_BODY_MEMORY: usize = 64 << 20;

impl FrontOptions {
    /// Whether `/metrics` carries series named by campaigns and policies
    /// (it then needs a token, as their delivery does).
    pub fn per_definition_metrics(&self) -> bool {
        self.metrics_top > 0 || !self.metrics_definitions.is_empty()
    }
}

/// What every front shares: the engine, the options (tokens, the in-flight
/// cap, load shedding) and the metrics, whose in-flight gauge is the one
/// load-shedding counter of every front.
pub struct AppState<C: Clock> {
    pub engine: Arc<Engine<C>>,
    pub options: FrontOptions,
    /// Bytes of request bodies being received, every front together.
    pub body_budget: body_budget::BodyBudget,
    /// Request counters, and the in-flight count that load shedding reads.
    pub metrics: Metrics,
    /// Owner mode: requests about users other nodes own go there.
    pub forwarder: forward::Forwarder,
    /// What shedding watches besides the in-flight count: the queue's
    /// standing delay and the CPU ([`shed::Shedder`]).
    pub shed: shed::Shedder,
}

fn figures<C: Clock + 'static>(
    engine: &Engine<C>,
    allow: &[String],
    top: usize,
) -> figures::Figures {
    let st = &engine.stats;
    let store = engine.store().stats();
    let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    figures::Figures {
        reservations_open: engine.open_reservations() as u64,
        reservations_expired: get(&st.expired),
        commits: get(&st.commits),
        late_commits: get(&st.late_commits),
        releases: get(&st.releases),
        events: get(&st.events),
        duplicate_events: get(&st.duplicate_events),
        writer_queue_depth: store.queue_depth,
        writer_groups: store.groups,
        writer_batches: store.batches,
        hot_records: engine.hot_len() as u64,
        hot_bytes: engine.hot_bytes() as u64,
        hot_hits: engine.hot_hits(),
        hot_misses: get(&st.hot_misses),
        disk_live_bytes: store.disk_bytes,
        rocksdb_memtable_bytes: store.memtable_bytes,
        rocksdb_pending_compaction_bytes: store.pending_compaction_bytes,
        rocksdb_estimated_keys: store.estimated_keys,
        cas: get(&st.cas),
        cas_conflicts: get(&st.cas_conflicts),
        hot_keys: get(&st.hot_keys),
        owner_claims: get(&st.owner_claims),
        owner_fenced: get(&st.owner_fenced),
        owner_heavy_users: engine.owner_heavy_users(),
        failed_open: get(&st.failed_open),
        identity_rechecks: get(&st.identity_rechecks),
        erasures: get(&st.erasures),
        lease_calls: get(&st.lease_calls),
        record_time_capped: get(&st.record_time_capped),
        grants: engine.grants_outstanding().0 as u64,
        grant_units: engine.grants_outstanding().1,
        unreported_units: engine.unreported_units(),
        unsettled: engine.unsettled_reservations() as u64,
        redis: engine.store().redis_stats().map(|r| figures::RedisFigures {
            calls: get(&r.calls),
            errors: get(&r.errors),
            timeouts: get(&r.timeouts),
            unreplicated: get(&r.unreplicated),
            clock_offset_ns: engine
                .store()
                .shared()
                .and_then(|s| s.clock_offset())
                .unwrap_or(0),
            latency_sum_us: get(&r.latency_us),
            buckets: std::array::from_fn(|i| get(&r.latency_buckets[i])),
        }),
        region: engine.region_figures(),
        definitions: engine.definition_figures(allow, top),
    }
}

/// The state of every front over `engine`.
pub fn app_state<C: Clock + 'static>(
    engine: Arc<Engine<C>>,
    options: FrontOptions,
) -> Arc<AppState<C>> {
    let figures_of = engine.clone();
    let (allow, top) = (options.metrics_definitions.clone(), options.metrics_top);
    engine.set_metrics_top(top, allow.len());
    let metrics = Metrics::new(
        figures::EngineFigures(Box::new(move || figures(&figures_of, &allow, top))),
        &options.connections,
        &options.tls_counters,
    );
    // Room for one largest body and its head whatever was configured.
    let body_budget = body_budget::BodyBudget::new(
        options.body_memory.max(options.max_body + (128 << 10)),
        metrics.overloaded_counter("body_memory"),
    );
    let forwarder = forward::Forwarder::new(engine.node_id(), options.peer_tls.clone());
    Arc::new(AppState {
        engine,
        forwarder,
        options,
        metrics,
        body_budget,
        shed: shed::Shedder::default(),
    })
}
