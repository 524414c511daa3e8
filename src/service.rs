//! `freqcap serve`: configuration (file, environment, flags) and the server's
//! life — open the store, serve HTTP, sweep, shut down cleanly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::api;
use crate::clock::SystemClock;
use crate::engine::{Engine, EngineOptions};
use crate::front::FrontOptions;
use crate::server::ConnCounters;
use crate::server::{self, ConnLimits};
use crate::store::{Durability, MemoryStore, RocksOptions, RocksStore, Store};

/// How log lines are written (stderr; the level from `FREQCAP_LOG`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields.message`,
    /// the event's other fields, `target`).
    Json,
}

/// Every option of the service. The TOML file uses these names; each has a
/// `FREQCAP_<NAME>` environment variable and a `--<name>` flag (flags win over
/// the environment, which wins over the file). `ops/freqcap.toml` documents
/// each.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServeConfig {
    /// Address to listen on; port 0 picks a free one (the log says which).
    pub listen: SocketAddr,
    /// Address of the gRPC front (docs/grpc.md), or `off`.
    pub grpc_listen: String,
    /// Address of the Redis-protocol front (docs/resp.md); unset: off.
    pub resp_listen: Option<SocketAddr>,
    /// Directory of definition files (`policies/`, `campaigns/`; docs/service.md,
    /// "Definitions as files"): loaded at start, reloaded on SIGHUP and when
    /// it changes; those definitions are read-only through the API.
    pub definitions: Option<PathBuf>,
    /// Directory of Envoy rate limit rules (docs/rls.md), served as
    /// `envoy.service.ratelimit.v3.RateLimitService` on `grpc_listen`;
    /// unset: off. Reloaded on SIGHUP.
    pub rls_config: Option<PathBuf>,
    /// RESP connections served at once (lowered, with `max_connections`, to
    /// fit the file-descriptor limit).
    pub resp_max_connections: usize,
    /// gRPC connections served at once; past it a connection is closed at
    /// accept. HTTP's `max_connections` is lowered, if needed, so both fit
    /// the file-descriptor limit.
    pub grpc_max_connections: usize,
    /// RocksDB directory.
    pub data_dir: PathBuf,
    /// Keep everything in memory (nothing survives a restart).
    pub memory: bool,
    /// Where state is kept: `rocksdb` (in `data_dir`), `memory` (as
    /// `memory = true`), or `redis-cluster://HOST:PORT[,HOST:PORT...]`, a
    /// Redis Cluster several nodes share (docs/cluster.md).
    pub store: String,
    /// This node's name among the nodes of a cluster (logs, metrics);
    /// default `<hostname>:<listen port>`.
    pub node_id: Option<String>,
    /// Every policy and campaign in shadow mode (docs/semantics.md,
    /// "Shadow mode"): decided and counted, never denying.
    pub shadow: bool,
    /// With a redis-cluster store: a screen whose user's record cannot be
    /// reached answers every known campaign eligible instead of 503.
    pub fail_open: bool,
    /// With a redis-cluster store: the deadline of one call to Redis, ms
    /// (a write and its WAIT together).
    pub redis_timeout_ms: u64,
    /// With a redis-cluster store: `commit` reports spend on leased
    /// campaign state before a commit is acknowledged, `batched` (default)
    /// once a second per grant in use and before a commit only past 0.1 %
    /// of the item's limit unreported (docs/cluster.md, "Leases").
    pub spend_reports: crate::engine::SpendReports,
    /// With a redis-cluster store: the layout records are written in, 3
    /// (default) or 2 while nodes of a build before layout 3 still share
    /// the cluster (docs/cluster.md, "Record layout").
    pub record_layout: u8,
    /// With a redis-cluster store: where a user's open reservations live,
    /// `shared` (default: in Redis, any node decides) or `owner` (in one
    /// owner node's memory; docs/cluster.md, "Owner mode").
    pub reservations: crate::cluster::owners::Mode,
    /// Owner mode: the `host:port` other nodes reach this node's HTTP API
    /// at, to forward requests for the users it owns; default the listen
    /// address (which must then not be a wildcard such as 0.0.0.0).
    pub advertise: Option<String>,
    pub durability: Durability,
    /// `text` (default) or `json`: one JSON object per log line, for log
    /// pipelines (docs/service.md, "Logs").
    pub log_format: LogFormat,
    /// Bytes the hot tier may use.
    pub memory_budget: usize,
    /// Largest request body, bytes.
    pub max_body: usize,
    /// Bytes of request bodies being received at once, every front and
    /// connection together; at least `max_body` (docs/service.md, "Memory").
    pub body_memory: usize,
    /// Most candidates per screen.
    pub max_candidates: usize,
    /// Longest key, user, campaign or event id, bytes.
    pub max_id_len: usize,
    /// Requests handled at once before answering 503.
    pub max_in_flight: usize,
    /// How long event ids are remembered, seconds.
    pub dedupe_horizon_secs: u64,
    /// How long an idle record stays in memory, seconds.
    pub idle_grace_secs: u64,
    /// How long a deleted policy or campaign is remembered, seconds (one
    /// re-created within it carries its counts on; 0: deletions are final).
    pub redefine_grace_secs: u64,
    /// Open reservations at once; a reserving request past it gets 503.
    pub max_open_reservations: usize,
    /// RocksDB's block cache, bytes (shared by every column family).
    pub block_cache_bytes: usize,
    /// RocksDB memtable size of the state and dedupe column families, bytes.
    pub write_buffer_bytes: usize,
    /// Total size of RocksDB's write-ahead log files, bytes.
    pub max_wal_bytes: u64,
    /// How long the writer holds write-behind debits, ms (0: at once).
    pub write_behind_ms: u64,
    /// Bearer token for decision endpoints (unset: open).
    pub decision_token: Option<String>,
    /// Bearer token for definitions and admin endpoints (unset: open).
    pub admin_token: Option<String>,
    /// Seconds from a request's first byte to the end of its head.
    pub header_timeout_secs: u64,
    /// Seconds a request may take to send its body (past it: 408).
    pub body_timeout_secs: u64,
    /// Seconds a connection may stay idle between requests.
    pub idle_timeout_secs: u64,
    /// Connections served at once (lowered to fit the file-descriptor limit).
    pub max_connections: usize,
    /// Connections accepted past `max_connections` for probes and scrapes only.
    pub probe_connections: usize,
    /// Seconds shutdown waits for requests in progress before closing them.
    pub drain_timeout_secs: u64,
    /// A request that waited longer than this to be run gets 503 at once, ms
    /// (a quarter of it while the queue stands: CoDel).
    pub shed_queue_delay_ms: u64,
    /// Past this percentage of the process's CPUs busy, `low` and
    /// `sheddable` requests get 503 at once; 0: off.
    pub shed_cpu_percent: u64,
    /// Past `max_in_flight`, a decision waits for a slot within its queue
    /// bound (adaptive LIFO, docs/service.md) instead of 503 at once.
    pub in_flight_wait: bool,
    /// `Host` names answered besides loopback ones when listening on loopback
    /// (or, when set, whatever the listen address).
    pub allowed_hosts: Vec<String>,
    /// The directory `POST /v1/admin/checkpoint` writes into (unset: off).
    pub backup_dir: Option<PathBuf>,
    /// Campaign and policy ids whose own series `/metrics` exports
    /// (docs/service.md, "Per-definition metrics").
    pub metrics_definitions: Vec<String>,
    /// How many of the most active other campaigns (and policies) `/metrics`
    /// exports series for.
    pub metrics_top: usize,
}

impl Default for ServeConfig {
    fn default() -> Self {
        let e = EngineOptions::default();
        let a = FrontOptions::default();
        let c = ConnLimits::default();
        let r = RocksOptions::default();
        ServeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc_listen: "127.0.0.1:8081".into(),
            resp_listen: None,
            rls_config: None,
            definitions: None,
            resp_max_connections: 1024,
            grpc_max_connections: 1024,
            data_dir: PathBuf::from("./freqcap-data"),
            memory: false,
            store: "rocksdb".into(),
            node_id: None,
            shadow: false,
            fail_open: false,
            redis_timeout_ms: 100,
            spend_reports: e.spend_reports,
            record_layout: e.record_layout,
            reservations: crate::cluster::owners::Mode::Shared,
            advertise: None,
            durability: Durability::Wal,
            log_format: LogFormat::Text,
            memory_budget: e.memory_budget,
            max_body: a.max_body,
            body_memory: a.body_memory,
            max_candidates: e.max_candidates,
            max_id_len: e.max_id_len,
            max_in_flight: a.max_in_flight,
            dedupe_horizon_secs: e.dedupe_horizon / 1_000_000_000,
            idle_grace_secs: e.idle_grace / 1_000_000_000,
            redefine_grace_secs: e.redefine_grace / 1_000_000_000,
            max_open_reservations: e.max_open_reservations,
            block_cache_bytes: r.block_cache_bytes,
            write_buffer_bytes: r.write_buffer_bytes,
            max_wal_bytes: r.max_wal_bytes,
            write_behind_ms: r.write_behind_ms,
            decision_token: None,
            admin_token: None,
            header_timeout_secs: c.header_timeout.as_secs(),
            body_timeout_secs: a.body_timeout.as_secs(),
            idle_timeout_secs: c.idle_timeout.as_secs(),
            max_connections: c.max_connections,
            probe_connections: c.probe_connections,
            drain_timeout_secs: c.drain_timeout.as_secs(),
            shed_queue_delay_ms: u64::try_from(a.shed_queue_delay.as_millis()).unwrap_or(u64::MAX),
            shed_cpu_percent: a.shed_cpu_permille / 10,
            in_flight_wait: a.in_flight_wait,
            allowed_hosts: Vec::new(),
            backup_dir: None,
            metrics_definitions: Vec::new(),
            metrics_top: 0,
        }
    }
}

impl ServeConfig {
    /// Reads a TOML file; errors name the field.
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        crate::model::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Owner mode: the address other nodes forward this node's users to
    /// (`None` in shared mode; port 0: the port the listener got); errors
    /// name the option.
    pub fn advertised(&self) -> Result<Option<SocketAddr>, String> {
        use crate::cluster::owners::Mode;
        if self.reservations == Mode::Shared {
            return Ok(None);
        }
        if !self.store.starts_with("redis-cluster://") {
            return Err(
                "reservations: owner needs a redis-cluster store (store = \"redis-cluster://...\")"
                    .into(),
            );
        }
        let at = match &self.advertise {
            Some(a) => a.parse::<SocketAddr>().map_err(|e| {
                format!("advertise: must be an IP address and port (host:port), got {a:?}: {e}")
            })?,
            None => self.listen,
        };
        if at.ip().is_unspecified() || (self.advertise.is_some() && at.port() == 0) {
            return Err(format!(
                "advertise: other nodes cannot reach {at}: set advertise to this node's address and HTTP port"
            ));
        }
        Ok(Some(at))
    }

    /// Refuses a configuration the service could not honour, naming the
    /// option: an empty token would be accepted at start and then refuse
    /// every request; a zero timeout would close every connection.
    pub fn check(&self) -> Result<(), String> {
        self.grpc_addr()?;
        match self.store.as_str() {
            "rocksdb" | "memory" => {
                if self.durability == Durability::Replicated {
                    return Err(
                        "durability: replicated needs a redis-cluster store (store = \"redis-cluster://...\")"
                            .into(),
                    );
                }
            }
            url => {
                crate::cluster::RedisOptions::parse(url, self.durability)?;
            }
        }
        if self.write_behind_ms > crate::store::rocks::MAX_WRITE_BEHIND_MS {
            return Err(format!(
                "write_behind_ms: at most {} (a crash loses that much of immediate debits), got {}",
                crate::store::rocks::MAX_WRITE_BEHIND_MS,
                self.write_behind_ms
            ));
        }
        if self.redis_timeout_ms == 0 {
            return Err("redis_timeout_ms: must be at least 1".into());
        }
        if !(2..=crate::store::codec::SHARED_FORMAT_VERSION).contains(&self.record_layout) {
            return Err(format!(
                "record_layout: must be 2 or {}, got {}",
                crate::store::codec::SHARED_FORMAT_VERSION,
                self.record_layout
            ));
        }
        if self
            .node_id
            .as_deref()
            .is_some_and(|n| n.is_empty() || n.len() > 128 || n.contains(' '))
        {
            return Err("node_id: must be 1 to 128 bytes, without spaces".into());
        }
        self.advertised()?;
        for (name, token) in [
            ("decision_token", &self.decision_token),
            ("admin_token", &self.admin_token),
        ] {
            if let Some(t) = token {
                crate::front::access::check_token(t).map_err(|e| format!("{name}: {e}"))?;
            }
        }
        if self.body_memory < self.max_body {
            return Err(format!(
                "body_memory: must be at least max_body ({} bytes), got {}",
                self.max_body, self.body_memory
            ));
        }
        for (name, v) in [
            ("header_timeout_secs", self.header_timeout_secs),
            ("body_timeout_secs", self.body_timeout_secs),
            ("idle_timeout_secs", self.idle_timeout_secs),
            ("max_connections", self.max_connections as u64),
            ("resp_max_connections", self.resp_max_connections as u64),
            ("grpc_max_connections", self.grpc_max_connections as u64),
        ] {
            if v == 0 {
                return Err(format!("{name}: must be at least 1"));
            }
        }
        if self.shed_cpu_percent > 100 {
            return Err(format!(
                "shed_cpu_percent: must be from 0 (off) to 100, got {}",
                self.shed_cpu_percent
            ));
        }
        // Each chosen campaign exports about 10 series plus one per cap:
        // a bound keeps a typo from exporting millions.
        if self.metrics_top > 1000 {
            return Err(format!(
                "metrics_top: at most 1000, got {}",
                self.metrics_top
            ));
        }
        if self.metrics_definitions.len() > 1000 {
            return Err(format!(
                "metrics_definitions: at most 1000 ids, got {}",
                self.metrics_definitions.len()
            ));
        }
        for h in &self.allowed_hosts {
            if h.is_empty() || h.contains([':', '/', ' ']) {
                return Err(format!(
                    "allowed_hosts: {h:?} is not a host name (give names without ports)"
                ));
            }
        }
        Ok(())
    }
}

/// Tokens shorter than this are warned about at start.
pub const MIN_TOKEN_CHARS: usize = 16;

impl ServeConfig {
    /// What the service runs with but should not (logged at start as
    /// warnings), each naming its option.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, token) in [
            ("decision_token", &self.decision_token),
            ("admin_token", &self.admin_token),
        ] {
            // Not refused: a short token may be a test's, and refusing
            // would stop a service that ran before. Counted in characters,
            // as a person reads them (check_token allows ASCII only).
            let len = token.as_deref().map_or(MIN_TOKEN_CHARS, str::len);
            if len < MIN_TOKEN_CHARS {
                let chars = if len == 1 { "character" } else { "characters" };
                out.push(format!(
                    "{name}: {len} {chars}; a token shorter than {MIN_TOKEN_CHARS} characters can be \
                     guessed (nothing slows repeated tries): use 32 random characters, e.g. \
                     `openssl rand -hex 16`"
                ));
            }
        }
        out
    }

    /// The gRPC address, `None` for `off`.
    pub fn grpc_addr(&self) -> Result<Option<SocketAddr>, String> {
        match self.grpc_listen.trim() {
            "off" => Ok(None),
            a => a.parse().map(Some).map_err(|_| {
                format!("grpc_listen: {a:?} is not ADDR:PORT (e.g. \"127.0.0.1:8081\") or \"off\"")
            }),
        }
    }
}

/// Waits for SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Runs the service until SIGTERM/SIGINT: stops accepting, drains requests in
/// flight, then flushes the writer.
pub async fn serve(config: ServeConfig) -> Result<(), String> {
    config.check()?;
    for w in config.warnings() {
        tracing::warn!("{w}");
    }
    let node_id = config.node_id.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "localhost".into());
        format!("{host}:{}", config.listen.port())
    });
    let store: Arc<dyn Store> = if config.store.starts_with("redis-cluster://") {
        let mut options = crate::cluster::RedisOptions::parse(&config.store, config.durability)?;
        options.call_timeout = Duration::from_millis(config.redis_timeout_ms);
        // Connecting waits on the network: off the executor.
        let redis =
            tokio::task::spawn_blocking(move || crate::cluster::RedisStore::connect(options))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
        tracing::info!(
            node_id,
            clustered = redis.clustered,
            "state in Redis ({})",
            config.store
        );
        Arc::new(redis)
    } else if config.memory || config.store == "memory" {
        Arc::new(MemoryStore::new())
    } else {
        let sizes = RocksOptions {
            block_cache_bytes: config.block_cache_bytes,
            write_buffer_bytes: config.write_buffer_bytes,
            max_wal_bytes: config.max_wal_bytes,
            write_behind_ms: config.write_behind_ms,
        };
        Arc::new(
            RocksStore::open_with(&config.data_dir, config.durability, sizes)
                .map_err(|e| e.to_string())?,
        )
    };
    let options = EngineOptions {
        memory_budget: config.memory_budget,
        max_candidates: config.max_candidates,
        max_id_len: config.max_id_len,
        dedupe_horizon: config.dedupe_horizon_secs.saturating_mul(1_000_000_000),
        idle_grace: config.idle_grace_secs.saturating_mul(1_000_000_000),
        redefine_grace: config.redefine_grace_secs.saturating_mul(1_000_000_000),
        max_open_reservations: config.max_open_reservations,
        fail_open: config.fail_open,
        shadow: config.shadow,
        node_id: node_id.clone(),
        spend_reports: config.spend_reports,
        record_layout: config.record_layout,
        ..EngineOptions::default()
    };
    // Opening reads definitions, which a shared store holds over the network:
    // with their primary failing over, the node waits for it as it waited to
    // connect (`crate::cluster::START_WAIT`), instead of exiting.
    let engine = tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        let mut tries = 0u32;
        loop {
            match Engine::open(store.clone(), SystemClock::new(), options.clone()) {
                Err(crate::engine::EngineError::Store(crate::store::StoreError::Unavailable(
                    why,
                ))) if store.shared().is_some()
                    && started.elapsed() < crate::cluster::START_WAIT =>
                {
                    if tries.is_multiple_of(10) {
                        tracing::warn!("waiting for Redis to read the definitions ({why})");
                    }
                    tries += 1;
                    std::thread::sleep(crate::cluster::START_RETRY);
                }
                r => return r,
            }
        }
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    let engine = Arc::new(engine);
    // Definition files before the first request: a bad directory stops the
    // start, as a bad config file does.
    let definitions_seen = match &config.definitions {
        None => None,
        Some(dir) => {
            let (e, d) = (engine.clone(), dir.clone());
            let r = tokio::task::spawn_blocking(move || {
                let seen = crate::definitions_dir::fingerprint(&d);
                crate::definitions_dir::load_at_start(&e, &d).map(|r| (r, seen))
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("definitions: {e}"))?;
            let (started, seen) = r;
            match started {
                crate::definitions_dir::Started::Applied(r) => {
                    tracing::info!(
                        dir = %dir.display(),
                        "definitions loaded from {}: {} written, {} deleted, {} unchanged",
                        dir.display(),
                        r.written,
                        r.deleted,
                        r.unchanged
                    );
                    Some((seen, true))
                }
                crate::definitions_dir::Started::Checked { writer } => {
                    tracing::info!(
                        dir = %dir.display(),
                        "definitions in {} are valid; {} is the definitions writer: this node \
                         applies the shared store's definitions, and its directory once it is the writer",
                        dir.display(),
                        writer.as_deref().unwrap_or("another node")
                    );
                    Some((seen, false))
                }
            }
        }
    };
    let connections = ConnCounters::default();
    let secs = Duration::from_secs;
    let state = api::app_state(
        engine.clone(),
        FrontOptions {
            max_body: config.max_body,
            body_memory: config.body_memory,
            max_in_flight: config.max_in_flight,
            decision_token: config.decision_token.clone(),
            admin_token: config.admin_token.clone(),
            sleep_on_wait: true,
            shed_queue_delay: Duration::from_millis(config.shed_queue_delay_ms),
            shed_cpu_permille: config.shed_cpu_percent.saturating_mul(10),
            in_flight_wait: config.in_flight_wait,
            body_timeout: secs(config.body_timeout_secs),
            // A browser page can reach a loopback service through DNS
            // rebinding; on loopback only loopback names (and the
            // configured ones) are answered.
            allowed_hosts: (config.listen.ip().is_loopback() || !config.allowed_hosts.is_empty())
                .then(|| config.allowed_hosts.clone()),
            backup_dir: config.backup_dir.clone(),
            connections: connections.clone(),
            metrics_definitions: config.metrics_definitions.clone(),
            metrics_top: config.metrics_top,
        },
    );
    let app = api::router_for(state.clone());
    if let (Some(dir), Some((seen, writer))) = (&config.definitions, definitions_seen) {
        tokio::spawn(crate::definitions_dir::watch(
            engine.clone(),
            dir.clone(),
            state.metrics.definition_reloads.clone(),
            seen,
            writer,
        ));
    }
    let rls = match &config.rls_config {
        None => None,
        Some(dir) => {
            if config.grpc_addr()?.is_none() {
                return Err(
                    "rls_config: Envoy's rate limit service is served on grpc_listen, which is off"
                        .into(),
                );
            }
            let handle = crate::rls::RulesHandle::open(dir, state.metrics.rls.clone())
                .map_err(|e| format!("rls_config: {e}"))?;
            let handle = Arc::new(handle);
            tracing::info!(dir = %dir.display(), rules = handle.current().count, "Envoy rate limit rules loaded from {}", dir.display());
            tokio::spawn(handle.clone().reload_on_sighup());
            Some(handle)
        }
    };
    // RESP connections take file descriptors too: HTTP's cap leaves room.
    let resp_max = if config.resp_listen.is_some() {
        config.resp_max_connections
    } else {
        0
    };
    let grpc_max = if config.grpc_addr()?.is_some() {
        config.grpc_max_connections
    } else {
        0
    };
    let limits = ConnLimits {
        header_timeout: secs(config.header_timeout_secs),
        idle_timeout: secs(config.idle_timeout_secs),
        max_connections: server::fit_to_fd_limit(
            config.max_connections,
            // gRPC keeps probe room of its own too.
            config.probe_connections * 2 + resp_max + grpc_max,
        ),
        probe_connections: config.probe_connections,
        drain_timeout: secs(config.drain_timeout_secs),
        first_request_timeout: None,
        http2_only: false,
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    // Owner mode: join the fleet before serving. The node owns no user
    // until its lease is active (a lease after joining); meanwhile its
    // requests go to the other members.
    let membership = match config.advertised()? {
        None => None,
        Some(at) => {
            let at = if at.port() == 0 { addr } else { at };
            let owners = Arc::new(crate::cluster::owners::Owners::new(
                &node_id,
                &at.to_string(),
            ));
            engine.set_owners(owners);
            let e = engine.clone();
            tokio::task::spawn_blocking(move || e.renew_membership())
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| {
                    format!("reservations: cannot join the fleet's members in Redis: {e}")
                })?;
            tracing::info!(%at, "owner mode: joined the fleet; forwarded requests reach this node at {at}");
            Some(membership_renewer(engine.clone()))
        }
    };
    // Bound before the line below, which tells scripts the service is up.
    let resp_listener = match config.resp_listen {
        None => None,
        Some(at) => {
            let l = tokio::net::TcpListener::bind(at)
                .await
                .map_err(|e| format!("resp_listen: cannot listen on {at}: {e}"))?;
            let resp_addr = l.local_addr().map_err(|e| e.to_string())?;
            tracing::info!(%resp_addr, "RESP (Redis protocol) listening on {resp_addr}");
            Some(l)
        }
    };
    let grpc_listener = match config.grpc_addr()? {
        None => None,
        Some(at) => {
            let l = tokio::net::TcpListener::bind(at).await.map_err(|e| {
                format!("grpc_listen: cannot listen on {at}: {e} (\"off\" disables gRPC)")
            })?;
            let grpc_addr = l.local_addr().map_err(|e| e.to_string())?;
            tracing::info!(%grpc_addr, "gRPC listening on {grpc_addr}");
            Some(l)
        }
    };
    tracing::info!(%addr, node_id, store = %config.store, data_dir = %config.data_dir.display(), memory = config.memory, max_connections = limits.max_connections, "freqcap listening on {addr}");
    // Expire reservations and drop idle records even when no request comes.
    let sweeper = {
        let engine = engine.clone();
        tokio::spawn(async move {
            // Every 250 ms: definitions other nodes changed are applied
            // within a second (a shared store); the sweep runs every 4th.
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            for n in 0u64.. {
                tick.tick().await;
                let e = engine.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    if let Err(err) = e.cluster_tick() {
                        tracing::warn!("cannot read definitions from the shared store: {err}");
                    }
                    if n % 4 == 0 {
                        e.sweep();
                    }
                })
                .await;
            }
        })
    };
    let drain = limits.drain_timeout;
    // One signal stops every listener.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let resp = match resp_listener {
        None => None,
        Some(l) => {
            let options = crate::resp::RespOptions {
                max_connections: resp_max,
                idle_timeout: secs(config.idle_timeout_secs),
                command_timeout: secs(config.header_timeout_secs),
                drain_timeout: drain,
                max_command: config.max_body,
            };
            Some(tokio::spawn(crate::resp::serve(
                l,
                state.clone(),
                options,
                stopped(stop_rx.clone()),
            )))
        }
    };
    let grpc = grpc_listener.map(|l| {
        let (state, stop) = (state.clone(), stopped(stop_rx.clone()));
        let rls = rls.clone();
        // HTTP's connection rules, HTTP/2 only, and a connection must send
        // its first call within header_timeout_secs (docs/grpc.md).
        let limits = ConnLimits {
            max_connections: grpc_max,
            first_request_timeout: Some(limits.header_timeout),
            http2_only: true,
            ..limits.clone()
        };
        tokio::spawn(async move {
            if let Err(e) = crate::grpc::serve(l, state, rls, limits, stop).await {
                tracing::error!("gRPC server failed: {e}");
            }
        })
    });
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!(
            "shutting down: no new connections; draining for {} s at most",
            drain.as_secs()
        );
        let _ = stop_tx.send(true);
    });
    server::serve(listener, app, limits, connections, stopped(stop_rx)).await;
    if let Some(r) = resp {
        let _ = r.await;
    }
    if let Some(g) = grpc {
        let _ = g.await;
    }
    sweeper.abort();
    if let Some((stop, thread)) = membership {
        stop.store(true, std::sync::atomic::Ordering::Release);
        let e = engine.clone();
        let left = tokio::task::spawn_blocking(move || {
            let _ = thread.join();
            e.leave_membership()
        })
        .await;
        match left {
            Ok(Ok(())) => tracing::info!(
                "owner mode: left the fleet; the other members take this node's users"
            ),
            Ok(Err(e)) => tracing::warn!(
                "owner mode: could not leave the fleet ({e}); its users move when the lease ends"
            ),
            Err(e) => tracing::warn!("owner mode: leaving the fleet failed: {e}"),
        }
    }
    tracing::info!("draining done; flushing the writer");
    // Spend committed here and not reported yet: the fleet reads it at once
    // (docs/cluster.md, "Spend is reported").
    engine.report_all_spend();
    // The campaigns' minutes (the ad-ops page) go with the last batch.
    engine.flush_timelines(true);
    if config.definitions.is_some() {
        // Another node takes the definitions directory over at once.
        engine.release_definitions_writer();
    }
    engine.flush().map_err(|e| e.to_string())?;
    tracing::info!("stopped");
    Ok(())
}

/// Owner mode: renews this node's membership lease every
/// [`crate::cluster::owners::RENEW_EVERY`] on a thread of its own (a
/// renewal must not wait behind the sweeper's work), until told to stop.
fn membership_renewer(
    engine: Arc<Engine<SystemClock>>,
) -> (
    Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<()>,
) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut failures = 0u64;
        while !flag.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::sleep(crate::cluster::owners::RENEW_EVERY);
            match engine.renew_membership() {
                Ok(()) => failures = 0,
                Err(e) => {
                    // Logged when it starts failing, then every 10 s.
                    if failures.is_multiple_of(20) {
                        tracing::warn!(
                            "owner mode: cannot renew this node's membership lease: {e}"
                        );
                    }
                    failures += 1;
                }
            }
        }
    });
    (stop, thread)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ServeConfig, String> {
        crate::model::from_toml(text).map_err(|e| e.to_string())
    }

    /// The commented example in ops/ is valid and states the defaults (only
    /// the data directory differs: a system path there).
    #[test]
    fn the_example_config_parses_and_states_the_defaults() {
        let text = include_str!("../ops/freqcap.toml");
        let c = parse(text).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/freqcap/data"));
        assert_eq!(
            c.backup_dir,
            Some(PathBuf::from("/var/lib/freqcap/checkpoints"))
        );
        let defaults = ServeConfig {
            data_dir: c.data_dir.clone(),
            backup_dir: c.backup_dir.clone(),
            ..ServeConfig::default()
        };
        assert_eq!(c, defaults);
    }

    #[test]
    fn a_config_file_sets_what_it_names_and_keeps_the_defaults() {
        let c = parse("listen = \"127.0.0.1:9090\"\ndurability = \"fsync\"\n").unwrap();
        assert_eq!(c.listen, SocketAddr::from(([127, 0, 0, 1], 9090)));
        assert_eq!(c.durability, Durability::Fsync);
        assert_eq!(c.max_body, ServeConfig::default().max_body);
    }

    #[test]
    fn bad_config_names_the_field() {
        let e = parse("max_bodyy = 5\n").unwrap_err();
        assert!(e.contains("max_bodyy"), "{e}");
        let e = parse("durability = \"sometimes\"\n").unwrap_err();
        assert!(e.starts_with("durability"), "{e}");
        let e = parse("listen = \"nowhere\"\n").unwrap_err();
        assert!(e.starts_with("listen"), "{e}");
        let e = parse("idle_grace_secs = -1\n").unwrap_err();
        assert!(e.starts_with("idle_grace_secs"), "{e}");
        let e = parse("write_behind_ms = 1001\n")
            .unwrap()
            .check()
            .unwrap_err();
        assert!(e.starts_with("write_behind_ms: at most 1000"), "{e}");
        assert!(parse("write_behind_ms = 20\n").unwrap().check().is_ok());
    }

    /// Tokens shorter than 16 characters are warned about, naming the
    /// option; longer ones and unset ones are not.
    #[test]
    fn short_tokens_are_warned_about_naming_the_option() {
        let config = ServeConfig {
            decision_token: Some("a".into()),
            admin_token: Some("0123456789abcde".into()),
            ..ServeConfig::default()
        };
        let w = config.warnings();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].starts_with("decision_token: 1 character"), "{w:?}");
        assert!(w[1].starts_with("admin_token: 15 characters"), "{w:?}");
        assert!(w.iter().all(|w| w.contains("16")), "{w:?}");
        let config = ServeConfig {
            decision_token: Some("0123456789abcdef".into()),
            ..ServeConfig::default()
        };
        assert_eq!(config.warnings(), Vec::<String>::new());
        assert_eq!(ServeConfig::default().warnings(), Vec::<String>::new());
    }

    #[test]
    fn unusable_settings_are_refused_naming_the_option() {
        for (text, field) in [
            ("decision_token = \"\"\n", "decision_token"),
            ("admin_token = \"two words\"\n", "admin_token"),
            ("header_timeout_secs = 0\n", "header_timeout_secs"),
            ("max_connections = 0\n", "max_connections"),
            ("allowed_hosts = [\"example.com:80\"]\n", "allowed_hosts"),
            ("record_layout = 4\n", "record_layout"),
            ("record_layout = 1\n", "record_layout"),
        ] {
            let e = parse(text).unwrap().check().unwrap_err();
            assert!(e.starts_with(field), "{text}: {e}");
        }
        assert_eq!(ServeConfig::default().check(), Ok(()));
    }
}
