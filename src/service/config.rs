//! The service's configuration: every option of `freqcap serve` (file,
//! environment, flags), its defaults, and the checks that refuse or warn
//! about a configuration before the server starts.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::cluster::Secret;
use crate::engine::EngineOptions;
use crate::front::FrontOptions;
use crate::server::ConnLimits;
use crate::store::{Durability, RocksOptions};

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
    /// What a `ShouldRateLimit` naming a domain with no rules gets:
    /// `error` (INVALID_ARGUMENT naming `domain`) or `ok` (as
    /// envoyproxy/ratelimit; docs/rls.md, "Errors").
    pub rls_unknown_domain: crate::rls::UnknownDomain,
    /// Per-rule series of Envoy's rate limit service (hits by domain and
    /// rule key, Envoy Gateway's names; docs/rls.md, "Metrics"), at most
    /// 1000 keys.
    pub rls_rule_metrics: bool,
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
    /// With a `rediss://` or `rediss-cluster://` store: the CA (PEM) Redis's
    /// certificate must chain to; unset: the system's roots.
    pub store_ca: Option<PathBuf>,
    /// With a TLS store: this node's client certificate and key (PEM), for
    /// a Redis that requires them (`tls-auth-clients yes`).
    pub store_cert: Option<PathBuf>,
    pub store_key: Option<PathBuf>,
    /// A file holding the store's password (its first line), instead of the
    /// URL; `FREQCAP_STORE_PASSWORD` gives it from the environment.
    pub store_password_file: Option<PathBuf>,
    /// The store's password from `FREQCAP_STORE_PASSWORD` (never from the
    /// file, never printed).
    #[serde(skip)]
    pub store_password: Option<Secret>,
    /// PEM certificate (then its chain) every listener (HTTP, gRPC, RESP)
    /// serves TLS with, with `tls_key`; unset: plaintext (docs/service.md,
    /// "TLS"). Reloaded when the file changes and on SIGHUP.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates: set, every connection must present a client
    /// certificate chaining to one of them (mutual TLS).
    pub tls_client_ca: Option<PathBuf>,
    /// Owner mode over TLS: the CA (PEM) other nodes' certificates chain
    /// to, when forwarding a request to a user's owner; default
    /// `tls_client_ca`.
    pub tls_peer_ca: Option<PathBuf>,
    /// How rate-limit header fields are named: `ietf` (`RateLimit-Policy`,
    /// `RateLimit`), `draft03` (`RateLimit-Limit`, `-Remaining`, `-Reset`) or
    /// `x-ratelimit` (`X-RateLimit-*`); HTTP and Envoy's rate limit answers.
    pub header_style: crate::front::ratelimit_fields::HeaderStyle,
    /// An OTLP/HTTP collector (`http://HOST:4318`) spans are exported to;
    /// needs a build with feature `otlp` (docs/service.md, "Tracing").
    pub otlp_endpoint: Option<String>,
    /// This node's name among the nodes of a cluster (logs, metrics);
    /// default `<hostname>:<listen port>`.
    pub node_id: Option<String>,
    /// The region this node's fleet is (docs/regions.md); with
    /// `global_store`, campaigns' budgets and period caps are leased to
    /// the region by the global tier. Unset: no regions.
    pub region: Option<String>,
    /// The global tier's Redis (`redis://` or `redis-cluster://` URL,
    /// `rediss` for TLS with `store_ca`), shared by every region.
    pub global_store: Option<String>,
    /// What a region grants itself once the global tier has been
    /// unreachable for 80 % of a region grant's life (24 s): `keep`
    /// (default: its last grant), `stop` (nothing more than it spent) or
    /// `share:F` (a share F of each total, which may go over it).
    pub region_safe: String,
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
    pub reservations: crate::cluster::owners::FleetMode,
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
            rls_unknown_domain: Default::default(),
            rls_rule_metrics: false,
            definitions: None,
            resp_max_connections: 1024,
            grpc_max_connections: 1024,
            data_dir: PathBuf::from("./freqcap-data"),
            memory: false,
            store: "rocksdb".into(),
            node_id: None,
            region: None,
            global_store: None,
            region_safe: "keep".into(),
            store_ca: None,
            store_cert: None,
            store_key: None,
            store_password_file: None,
            store_password: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_peer_ca: None,
            otlp_endpoint: None,
            header_style: Default::default(),
            shadow: false,
            fail_open: false,
            redis_timeout_ms: 100,
            spend_reports: e.spend_reports,
            record_layout: e.record_layout,
            reservations: crate::cluster::owners::FleetMode::Shared,
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
        use crate::cluster::owners::FleetMode;
        if self.reservations == FleetMode::Shared {
            return Ok(None);
        }
        if !crate::cluster::RedisOptions::is_url(&self.store) {
            return Err(
                "reservations: owner needs a Redis store (store = \"redis-cluster://...\")".into(),
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
                        "durability: replicated needs a Redis store (store = \"redis-cluster://...\")"
                            .into(),
                    );
                }
            }
            url => {
                crate::cluster::RedisOptions::parse(url, self.durability)?;
            }
        }
        self.check_tls()?;
        self.check_region()?;
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

impl ServeConfig {
    /// A region needs a global tier and a Redis store of its own (each
    /// region is a fleet); each is refused naming the option.
    fn check_region(&self) -> Result<(), String> {
        self.region_safe
            .parse::<crate::engine::SafeCapacity>()
            .map_err(|e| format!("region_safe: {e}"))?;
        match (&self.region, &self.global_store) {
            (None, None) => Ok(()),
            (Some(_), None) => Err("global_store: a region needs the global tier's URL".into()),
            (None, Some(_)) => Err("region: global_store is set: name this node's region".into()),
            (Some(name), Some(url)) => {
                if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
                    return Err(format!(
                        "region: must be 1 to 64 printable characters, got {name:?}"
                    ));
                }
                if !crate::cluster::RedisOptions::is_url(&self.store) {
                    return Err(
                        "region: a region is a fleet: store must be a redis or redis-cluster URL"
                            .into(),
                    );
                }
                crate::cluster::RedisOptions::parse(url, Durability::Wal)
                    .map(drop)
                    .map_err(|e| format!("global_store: {e}"))
            }
        }
    }

    /// The TLS files of the listeners, `None` for plaintext; errors name
    /// the option missing its pair.
    pub fn tls_files(&self) -> Result<Option<crate::tls::TlsFiles>, String> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(crate::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
            })),
            (Some(_), None) => Err("tls_key: required with tls_cert".into()),
            (None, Some(_)) => Err("tls_cert: required with tls_key".into()),
            (None, None) => {
                for (name, set) in [
                    ("tls_client_ca", self.tls_client_ca.is_some()),
                    ("tls_peer_ca", self.tls_peer_ca.is_some()),
                ] {
                    if set {
                        return Err(format!(
                            "{name}: needs tls_cert and tls_key (TLS on the listeners)"
                        ));
                    }
                }
                Ok(None)
            }
        }
    }

    fn check_tls(&self) -> Result<(), String> {
        let tls = self.tls_files()?;
        if tls.is_some()
            && self.reservations == crate::cluster::owners::FleetMode::Owner
            && self.tls_peer_ca.is_none()
            && self.tls_client_ca.is_none()
        {
            return Err(
                "tls_peer_ca: owner mode over TLS forwards requests to other nodes: give the CA their certificates chain to (or tls_client_ca)"
                    .into(),
            );
        }
        if self.store_cert.is_some() != self.store_key.is_some() {
            let missing = if self.store_cert.is_some() {
                "store_key"
            } else {
                "store_cert"
            };
            return Err(format!("{missing}: store_cert and store_key go together"));
        }
        if self.store_password.is_some() && self.store_password_file.is_some() {
            return Err(
                "store_password_file: the password is also given by FREQCAP_STORE_PASSWORD; give one"
                    .into(),
            );
        }
        Ok(())
    }

    /// The store's password from `store_password_file` or
    /// `FREQCAP_STORE_PASSWORD`, if either is given.
    pub fn store_password(&self) -> Result<Option<Secret>, String> {
        if let Some(p) = &self.store_password {
            return Ok(Some(p.clone()));
        }
        let Some(path) = &self.store_password_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("store_password_file: cannot read {}: {e}", path.display()))?;
        let first = text.lines().next().unwrap_or("").trim_end_matches('\r');
        if first.is_empty() {
            return Err(format!(
                "store_password_file: {} has no password on its first line",
                path.display()
            ));
        }
        Ok(Some(Secret(first.to_owned())))
    }

    /// `store` as logs and answers show it: a password in the URL replaced
    /// by `***`.
    pub fn store_shown(&self) -> String {
        crate::cluster::RedisOptions::redact(&self.store)
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
        let text = include_str!("../../ops/freqcap.toml");
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

    /// Region settings refused at start, each naming its option
    /// (docs/regions.md, "Deploying").
    #[test]
    fn bad_region_settings_name_the_option() {
        let check = |text: &str| parse(text).unwrap().check();
        let cluster = "store = \"redis-cluster://127.0.0.1:7000\"\n";
        for (text, want) in [
            ("region = \"eu\"\n", "global_store: a region needs"),
            (
                "global_store = \"redis://127.0.0.1:6379\"\n",
                "region: global_store is set",
            ),
            (
                "region = \"eu\"\nglobal_store = \"redis://127.0.0.1:6379\"\n",
                "region: a region is a fleet",
            ),
            (
                &format!("{cluster}region = \"\"\nglobal_store = \"redis://h:1\"\n"),
                "region: must be 1 to 64",
            ),
            (
                &format!("{cluster}region = \"eu\"\nglobal_store = \"http://h:1\"\n"),
                "global_store:",
            ),
            (
                &format!("{cluster}region_safe = \"share:1.5\"\n"),
                "region_safe: must be stop, keep or share:F",
            ),
        ] {
            let e = check(text).unwrap_err();
            assert!(e.starts_with(want), "{text}: {e}");
        }
        let ok = format!(
            "{cluster}region = \"eu\"\nglobal_store = \"rediss://:pw@h:6380\"\nregion_safe = \"share:0.2\"\n"
        );
        assert!(check(&ok).is_ok());
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
