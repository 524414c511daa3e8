//! The `freqcap` command line: `serve` runs the service; `replay` runs the
//! same API on a virtual clock; `simulate` runs ad traffic through the engine
//! on a virtual clock and reports on pacing; `validate` and `schemas` are
//! definition tools.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use freqcap::model::{self, PolicyDef};
use freqcap::service::{self, ServeConfig};
use freqcap::store::Durability;

/// Frequency capping and rate limiting: exact limits, stacked decisions, reservations.
#[derive(Parser)]
#[command(
    name = "freqcap",
    version,
    about,
    after_help = "Examples:\n  freqcap serve\n  freqcap serve --listen 127.0.0.1:0 --memory\n  freqcap serve --config ops/freqcap.toml\n  freqcap replay < ops.jsonl > answers.jsonl\n  freqcap validate policy.json\n  freqcap schemas --out schemas/"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP service (defaults: 127.0.0.1:8080, RocksDB in
    /// ./freqcap-data, durability wal). Flags override FREQCAP_* variables,
    /// which override the --config file.
    Serve(Box<ServeArgs>),
    /// Answer a JSONL file of timed requests on a virtual clock: each line
    /// `{"at_ms", "method", "path", "body"}` from stdin gives one line
    /// `{"at_ms", "status", "body"}` on stdout, as the live service would have
    /// answered at that time. State is in memory unless --data-dir is given.
    Replay {
        /// Replay against (and into) this RocksDB data directory.
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Validate a policy definition (JSON, or TOML by the .toml extension) and
    /// print it as stored, with any warnings, or the error naming the field;
    /// or Envoy rate limit rules (a directory, or a .yaml/.yml file; see
    /// docs/rls.md) and print what they hold, or the error naming the file
    /// and the path in it.
    Validate {
        /// The policy file, or the rules directory or file.
        file: PathBuf,
    },
    /// Run a day or week of ad requests (a JSONL log or seeded synthetic
    /// traffic) through the engine on a virtual clock, and write a pacing report
    /// (summary.json, summary.md, SVG pictures) into --out. See docs/pacing.md.
    /// `freqcap simulate overload` runs limiters against an overloaded
    /// backend instead (docs/adaptive.md).
    Simulate(Box<SimulateCmd>),
    /// Forecast each campaign's delivery per day (impressions, spend, unique
    /// users and households, frequency) under all its caps and pacing, from
    /// a traffic log or synthetic traffic, on a sample of users; with
    /// --compare, against the whole traffic too. Writes forecast.json and
    /// forecast.md into --out. See docs/forecast.md.
    Forecast(Box<freqcap::simulate::ForecastArgs>),
    /// Write the JSON Schemas of the definitions into a folder.
    Schemas {
        /// The folder to write to.
        #[arg(long, default_value = "schemas")]
        out: PathBuf,
    },
}

/// `freqcap simulate`: pacing (its flags), or a kind named by a subcommand.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct SimulateCmd {
    #[command(subcommand)]
    what: Option<SimulateWhat>,
    #[command(flatten)]
    pacing: Option<freqcap::simulate::SimulateArgs>,
}

#[derive(Subcommand)]
enum SimulateWhat {
    /// A backend of known capacity behind no limit, a static one and each
    /// adaptive algorithm, from 0.5× to 10× its capacity, the capacity
    /// halved and restored mid-run, on a virtual clock: goodput, latency,
    /// availability per priority, the limit over time (overload.md,
    /// overload.json, SVG pictures in --out). See docs/adaptive.md.
    Overload(freqcap::simulate::overload::OverloadArgs),
}

/// `freqcap serve` flags; each unset one falls back to its environment variable,
/// then to the config file, then to the default.
#[derive(Args)]
struct ServeArgs {
    /// TOML file with any of the options below (same names, `_` for `-`).
    #[arg(long, env = "FREQCAP_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on (port 0: any free port; the log says which).
    #[arg(long, env = "FREQCAP_LISTEN")]
    listen: Option<std::net::SocketAddr>,
    /// Address of the gRPC front (docs/grpc.md), or `off`; default 127.0.0.1:8081.
    #[arg(long, env = "FREQCAP_GRPC_LISTEN")]
    grpc_listen: Option<String>,
    /// Directory of definition files (policies/*.json|toml,
    /// campaigns/*.json|toml; docs/service.md), reloaded on SIGHUP and when
    /// it changes; read-only through the API.
    #[arg(long, env = "FREQCAP_DEFINITIONS")]
    definitions: Option<PathBuf>,
    /// Directory of Envoy rate limit rules (envoyproxy/ratelimit's YAML,
    /// docs/rls.md), served on the gRPC listener; reloaded on SIGHUP.
    #[arg(long, env = "FREQCAP_RLS_CONFIG")]
    rls_config: Option<PathBuf>,
    /// What an Envoy rate limit call naming a domain with no rules gets:
    /// `error` (INVALID_ARGUMENT, the default) or `ok` (as
    /// envoyproxy/ratelimit; docs/rls.md).
    #[arg(long, env = "FREQCAP_RLS_UNKNOWN_DOMAIN", value_enum)]
    rls_unknown_domain: Option<freqcap::rls::UnknownDomain>,
    /// Per-rule series of Envoy's rate limit service (hits by domain and
    /// rule key, Envoy Gateway's names; at most 1000 keys).
    #[arg(long, env = "FREQCAP_RLS_RULE_METRICS", num_args = 0..=1, default_missing_value = "true")]
    rls_rule_metrics: Option<bool>,
    /// Address of the Redis-protocol front (CL.THROTTLE, FC.CHECK; docs/resp.md); unset: off.
    #[arg(long, env = "FREQCAP_RESP_LISTEN")]
    resp_listen: Option<std::net::SocketAddr>,
    /// RESP connections served at once.
    #[arg(long, env = "FREQCAP_RESP_MAX_CONNECTIONS")]
    resp_max_connections: Option<usize>,
    /// gRPC connections served at once.
    #[arg(long, env = "FREQCAP_GRPC_MAX_CONNECTIONS")]
    grpc_max_connections: Option<usize>,
    /// RocksDB data directory.
    #[arg(long, env = "FREQCAP_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Keep state in memory only (`--memory=false` overrides a file's `true`).
    #[arg(long, env = "FREQCAP_MEMORY", num_args = 0..=1, default_missing_value = "true")]
    memory: Option<bool>,
    /// rocksdb (default), memory, redis-cluster://[USER:PASSWORD@]HOST:PORT[,...],
    /// rediss-cluster:// (TLS), or redis:// / rediss:// for one Redis.
    #[arg(long, env = "FREQCAP_STORE")]
    store: Option<String>,
    /// With a rediss:// store: the CA (PEM) Redis's certificate chains to
    /// (default: the system's roots).
    #[arg(long, env = "FREQCAP_STORE_CA")]
    store_ca: Option<PathBuf>,
    /// With a rediss:// store: this node's client certificate (PEM), for a
    /// Redis that requires one; with --store-key.
    #[arg(long, env = "FREQCAP_STORE_CERT")]
    store_cert: Option<PathBuf>,
    /// The private key (PEM) of --store-cert.
    #[arg(long, env = "FREQCAP_STORE_KEY")]
    store_key: Option<PathBuf>,
    /// A file whose first line is the store's password (instead of the
    /// URL; FREQCAP_STORE_PASSWORD gives it from the environment).
    #[arg(long, env = "FREQCAP_STORE_PASSWORD_FILE")]
    store_password_file: Option<PathBuf>,
    /// TLS on every listener: the certificate (PEM, then its chain); with
    /// --tls-key. Reloaded when the file changes and on SIGHUP.
    #[arg(long, env = "FREQCAP_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "FREQCAP_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: every client must present a certificate chaining to
    /// these CAs (PEM).
    #[arg(long, env = "FREQCAP_TLS_CLIENT_CA")]
    tls_client_ca: Option<PathBuf>,
    /// Owner mode over TLS: the CA (PEM) other nodes' certificates chain
    /// to (default --tls-client-ca).
    #[arg(long, env = "FREQCAP_TLS_PEER_CA")]
    tls_peer_ca: Option<PathBuf>,
    /// How rate-limit header fields are named: ietf (RateLimit-Policy,
    /// RateLimit; the default), draft03 (RateLimit-Limit, -Remaining,
    /// -Reset) or x-ratelimit (X-RateLimit-*).
    #[arg(long, env = "FREQCAP_HEADER_STYLE", value_enum)]
    header_style: Option<freqcap::front::ratelimit_fields::HeaderStyle>,
    /// Spans exported over OTLP/HTTP to this collector (http://HOST:4318;
    /// builds with feature `otlp`; docs/service.md, "Tracing").
    #[arg(long, env = "FREQCAP_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// This node's name in a cluster (default <hostname>:<listen port>).
    #[arg(long, env = "FREQCAP_NODE_ID")]
    node_id: Option<String>,
    /// This node's region (docs/regions.md): campaigns' budgets and period
    /// caps are leased to it by the global tier (`--global-store`).
    #[arg(long, env = "FREQCAP_REGION")]
    region: Option<String>,
    /// The global tier's Redis URL, shared by every region.
    #[arg(long, env = "FREQCAP_GLOBAL_STORE")]
    global_store: Option<String>,
    /// A region cut off from the global tier: keep (default), stop or share:F.
    #[arg(long, env = "FREQCAP_REGION_SAFE")]
    region_safe: Option<String>,
    /// Shadow mode for every policy and campaign: decided and counted,
    /// always answered allowed (`would_deny` says what enforcing would do).
    #[arg(long, env = "FREQCAP_SHADOW", num_args = 0..=1, default_missing_value = "true")]
    shadow: Option<bool>,
    /// With a redis-cluster store: screens answer eligible when the user's
    /// record cannot be reached (`--fail-open=false` overrides a file's `true`).
    #[arg(long, env = "FREQCAP_FAIL_OPEN", num_args = 0..=1, default_missing_value = "true")]
    fail_open: Option<bool>,
    /// With a redis-cluster store: report spend before acknowledging a
    /// commit (commit) or once a second, and before a commit only past
    /// 0.1 % of a limit unreported (batched, the default).
    #[arg(long, env = "FREQCAP_SPEND_REPORTS")]
    spend_reports: Option<freqcap::engine::SpendReports>,
    /// With a redis-cluster store: the layout records are written in (3;
    /// 2 during a rolling upgrade from a build before 3).
    #[arg(long, env = "FREQCAP_RECORD_LAYOUT")]
    record_layout: Option<u8>,
    /// With a redis-cluster store: where users' open reservations live,
    /// shared (in Redis, the default) or owner (in one owner node's memory).
    #[arg(long, env = "FREQCAP_RESERVATIONS")]
    reservations: Option<freqcap::cluster::owners::FleetMode>,
    /// Owner mode: host:port other nodes reach this node's HTTP API at
    /// (default: the listen address).
    #[arg(long, env = "FREQCAP_ADVERTISE")]
    advertise: Option<String>,
    /// With a redis-cluster store: deadline of one Redis call, ms.
    #[arg(long, env = "FREQCAP_REDIS_TIMEOUT_MS")]
    redis_timeout_ms: Option<u64>,
    /// fsync, wal, async (RocksDB) or replicated (redis-cluster).
    #[arg(long, env = "FREQCAP_DURABILITY")]
    durability: Option<Durability>,
    /// text (default) or json: how log lines are written.
    #[arg(long, env = "FREQCAP_LOG_FORMAT")]
    log_format: Option<freqcap::service::LogFormat>,
    /// Bytes the hot tier may use.
    #[arg(long, env = "FREQCAP_MEMORY_BUDGET")]
    memory_budget: Option<usize>,
    /// Largest request body in bytes.
    #[arg(long, env = "FREQCAP_MAX_BODY")]
    max_body: Option<usize>,
    /// Bytes of request bodies being received at once, all connections and
    /// listeners together (past it: 503 overloaded).
    #[arg(long, env = "FREQCAP_BODY_MEMORY")]
    body_memory: Option<usize>,
    /// Most candidates per screen.
    #[arg(long, env = "FREQCAP_MAX_CANDIDATES")]
    max_candidates: Option<usize>,
    /// Longest key, user, campaign, policy or event id, in bytes.
    #[arg(long, env = "FREQCAP_MAX_ID_LEN")]
    max_id_len: Option<usize>,
    /// How long event ids are remembered for deduplication, in seconds.
    #[arg(long, env = "FREQCAP_DEDUPE_HORIZON_SECS")]
    dedupe_horizon_secs: Option<u64>,
    /// How long a record stays in memory once idle, in seconds.
    #[arg(long, env = "FREQCAP_IDLE_GRACE_SECS")]
    idle_grace_secs: Option<u64>,
    /// How long a deleted policy or campaign is remembered, in seconds: one
    /// re-created within it carries its counts on (0: a deletion is final).
    #[arg(long, env = "FREQCAP_REDEFINE_GRACE_SECS")]
    redefine_grace_secs: Option<u64>,
    /// Requests handled at once before 503 overloaded.
    #[arg(long, env = "FREQCAP_MAX_IN_FLIGHT")]
    max_in_flight: Option<usize>,
    /// Open reservations at once; past it a reserving request gets 503 overloaded.
    #[arg(long, env = "FREQCAP_MAX_OPEN_RESERVATIONS")]
    max_open_reservations: Option<usize>,
    /// RocksDB's block cache, in bytes.
    #[arg(long, env = "FREQCAP_BLOCK_CACHE_BYTES")]
    block_cache_bytes: Option<usize>,
    /// RocksDB memtable size of the state and dedupe column families, in bytes.
    #[arg(long, env = "FREQCAP_WRITE_BUFFER_BYTES")]
    write_buffer_bytes: Option<usize>,
    /// Total size of RocksDB's write-ahead log files, in bytes.
    #[arg(long, env = "FREQCAP_MAX_WAL_BYTES")]
    max_wal_bytes: Option<u64>,
    /// How long RocksDB's writer holds write-behind debits before writing
    /// them, in ms (0: at once; at most 1000). A crash loses that window.
    #[arg(long, env = "FREQCAP_WRITE_BEHIND_MS")]
    write_behind_ms: Option<u64>,
    /// Bearer token for decision endpoints (16 characters or more; shorter
    /// ones are warned about). A flag shows in `ps`: set FREQCAP_DECISION_TOKEN
    /// or `decision_token` in the --config file instead.
    #[arg(long, env = "FREQCAP_DECISION_TOKEN", hide_env_values = true)]
    decision_token: Option<String>,
    /// Bearer token for definition (admin) endpoints (16 characters or more;
    /// shorter ones are warned about). A flag shows in `ps`: set
    /// FREQCAP_ADMIN_TOKEN or `admin_token` in the --config file instead.
    #[arg(long, env = "FREQCAP_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Seconds from a request's first byte to the end of its head.
    #[arg(long, env = "FREQCAP_HEADER_TIMEOUT_SECS")]
    header_timeout_secs: Option<u64>,
    /// Seconds a request may take to send its body (past it: 408).
    #[arg(long, env = "FREQCAP_BODY_TIMEOUT_SECS")]
    body_timeout_secs: Option<u64>,
    /// Seconds a connection may stay idle between requests.
    #[arg(long, env = "FREQCAP_IDLE_TIMEOUT_SECS")]
    idle_timeout_secs: Option<u64>,
    /// Connections served at once (lowered to fit the file-descriptor limit).
    #[arg(long, env = "FREQCAP_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// Connections accepted past max-connections for probes and scrapes only.
    #[arg(long, env = "FREQCAP_PROBE_CONNECTIONS")]
    probe_connections: Option<usize>,
    /// Seconds shutdown waits for requests in progress.
    #[arg(long, env = "FREQCAP_DRAIN_TIMEOUT_SECS")]
    drain_timeout_secs: Option<u64>,
    /// A request that waited longer than this (ms) to be run gets 503 at once
    /// (a quarter of it while the queue stands: CoDel).
    #[arg(long, env = "FREQCAP_SHED_QUEUE_DELAY_MS")]
    shed_queue_delay_ms: Option<u64>,
    /// Past this percentage of the process's CPUs busy, low and sheddable
    /// requests get 503 at once (0: off; default 95).
    #[arg(long, env = "FREQCAP_SHED_CPU_PERCENT")]
    shed_cpu_percent: Option<u64>,
    /// Past max_in_flight, a decision waits for a slot within its queue
    /// bound (adaptive LIFO) instead of 503 at once
    /// (`--in-flight-wait=false` overrides a file's `true`).
    #[arg(long, env = "FREQCAP_IN_FLIGHT_WAIT", num_args = 0..=1, default_missing_value = "true")]
    in_flight_wait: Option<bool>,
    /// Host names answered besides loopback ones (comma-separated).
    #[arg(long, env = "FREQCAP_ALLOWED_HOSTS", value_delimiter = ',')]
    allowed_hosts: Option<Vec<String>>,
    /// The directory checkpoints are written into (unset: checkpoints off).
    #[arg(long, env = "FREQCAP_BACKUP_DIR")]
    backup_dir: Option<PathBuf>,
    /// Campaign and policy ids with series of their own in /metrics
    /// (comma-separated).
    #[arg(long, env = "FREQCAP_METRICS_DEFINITIONS", value_delimiter = ',')]
    metrics_definitions: Option<Vec<String>>,
    /// Also export series for this many of the most active other campaigns
    /// and policies.
    #[arg(long, env = "FREQCAP_METRICS_TOP")]
    metrics_top: Option<usize>,
}

impl ServeArgs {
    fn config(self) -> Result<ServeConfig, String> {
        let mut c = match &self.config {
            Some(p) => ServeConfig::from_file(p)?,
            None => ServeConfig::default(),
        };
        if let Some(v) = self.listen {
            c.listen = v;
        }
        if let Some(v) = self.grpc_listen {
            c.grpc_listen = v;
        }
        if self.resp_listen.is_some() {
            c.resp_listen = self.resp_listen;
        }
        if self.rls_config.is_some() {
            c.rls_config = self.rls_config;
        }
        for (field, flag) in [
            (&mut c.store_ca, self.store_ca),
            (&mut c.store_cert, self.store_cert),
            (&mut c.store_key, self.store_key),
            (&mut c.store_password_file, self.store_password_file),
            (&mut c.tls_cert, self.tls_cert),
            (&mut c.tls_key, self.tls_key),
            (&mut c.tls_client_ca, self.tls_client_ca),
            (&mut c.tls_peer_ca, self.tls_peer_ca),
        ] {
            if flag.is_some() {
                *field = flag;
            }
        }
        if self.otlp_endpoint.is_some() {
            c.otlp_endpoint = self.otlp_endpoint;
        }
        if let Some(v) = self.header_style {
            c.header_style = v;
        }
        // From the environment only: a flag would show in `ps`, a file
        // option is store_password_file.
        if let Ok(p) = std::env::var("FREQCAP_STORE_PASSWORD")
            && !p.is_empty()
        {
            c.store_password = Some(freqcap::cluster::Secret(p));
        }
        if let Some(v) = self.rls_rule_metrics {
            c.rls_rule_metrics = v;
        }
        if let Some(v) = self.rls_unknown_domain {
            c.rls_unknown_domain = v;
        }
        if self.definitions.is_some() {
            c.definitions = self.definitions;
        }
        if let Some(v) = self.resp_max_connections {
            c.resp_max_connections = v;
        }
        if let Some(v) = self.grpc_max_connections {
            c.grpc_max_connections = v;
        }
        if let Some(v) = self.data_dir {
            c.data_dir = v;
        }
        if let Some(v) = self.memory {
            c.memory = v;
        }
        if let Some(v) = self.max_id_len {
            c.max_id_len = v;
        }
        if let Some(v) = self.dedupe_horizon_secs {
            c.dedupe_horizon_secs = v;
        }
        if let Some(v) = self.idle_grace_secs {
            c.idle_grace_secs = v;
        }
        if let Some(v) = self.redefine_grace_secs {
            c.redefine_grace_secs = v;
        }
        if let Some(v) = self.store {
            c.store = v;
        }
        if let Some(v) = self.node_id {
            c.node_id = Some(v);
        }
        if let Some(v) = self.region {
            c.region = Some(v);
        }
        if let Some(v) = self.global_store {
            c.global_store = Some(v);
        }
        if let Some(v) = self.region_safe {
            c.region_safe = v;
        }
        if let Some(v) = self.shadow {
            c.shadow = v;
        }
        if let Some(v) = self.fail_open {
            c.fail_open = v;
        }
        if let Some(v) = self.redis_timeout_ms {
            c.redis_timeout_ms = v;
        }
        if let Some(v) = self.spend_reports {
            c.spend_reports = v;
        }
        if let Some(v) = self.record_layout {
            c.record_layout = v;
        }
        if let Some(v) = self.reservations {
            c.reservations = v;
        }
        if let Some(v) = &self.advertise {
            c.advertise = Some(v.clone());
        }
        if let Some(v) = self.durability {
            c.durability = v;
        }
        if let Some(v) = self.log_format {
            c.log_format = v;
        }
        if let Some(v) = self.memory_budget {
            c.memory_budget = v;
        }
        if let Some(v) = self.max_body {
            c.max_body = v;
        }
        if let Some(v) = self.body_memory {
            c.body_memory = v;
        }
        if let Some(v) = self.max_candidates {
            c.max_candidates = v;
        }
        if let Some(v) = self.max_in_flight {
            c.max_in_flight = v;
        }
        if let Some(v) = self.max_open_reservations {
            c.max_open_reservations = v;
        }
        if let Some(v) = self.block_cache_bytes {
            c.block_cache_bytes = v;
        }
        if let Some(v) = self.write_buffer_bytes {
            c.write_buffer_bytes = v;
        }
        if let Some(v) = self.max_wal_bytes {
            c.max_wal_bytes = v;
        }
        if let Some(v) = self.write_behind_ms {
            c.write_behind_ms = v;
        }
        if self.decision_token.is_some() {
            c.decision_token = self.decision_token;
        }
        if self.admin_token.is_some() {
            c.admin_token = self.admin_token;
        }
        if let Some(v) = self.header_timeout_secs {
            c.header_timeout_secs = v;
        }
        if let Some(v) = self.body_timeout_secs {
            c.body_timeout_secs = v;
        }
        if let Some(v) = self.idle_timeout_secs {
            c.idle_timeout_secs = v;
        }
        if let Some(v) = self.max_connections {
            c.max_connections = v;
        }
        if let Some(v) = self.probe_connections {
            c.probe_connections = v;
        }
        if let Some(v) = self.drain_timeout_secs {
            c.drain_timeout_secs = v;
        }
        if let Some(v) = self.shed_queue_delay_ms {
            c.shed_queue_delay_ms = v;
        }
        if let Some(v) = self.shed_cpu_percent {
            c.shed_cpu_percent = v;
        }
        if let Some(v) = self.in_flight_wait {
            c.in_flight_wait = v;
        }
        if let Some(v) = self.metrics_definitions {
            c.metrics_definitions = v;
        }
        if let Some(v) = self.metrics_top {
            c.metrics_top = v;
        }
        if let Some(v) = self.allowed_hosts {
            c.allowed_hosts = v;
        }
        if self.backup_dir.is_some() {
            c.backup_dir = self.backup_dir;
        }
        Ok(c)
    }
}

/// mimalloc rather than the system allocator: see Cargo.toml. Only the
/// binary sets it, so the library leaves the choice to whoever embeds it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("freqcap: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Serve(args) => {
            // The configuration first: it says how to log (its own errors
            // go to stderr as `freqcap: ...`).
            let config = args.config()?;
            // Kept to the end: at exit it flushes the spans not yet sent.
            let _logs = service::init_logs(&config)?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                // Fairness under saturation. A worker's local queue holds 256
                // tasks; the connections woken past that wait in the global
                // queue, which tokio's adaptive interval visits about once
                // per 200 µs of work: with 2048 busy connections on one
                // core, a probe's connection waited 100-500 ms there (9 % of
                // requests, freqcap_queue_delay_seconds) while the rest
                // waited 1-5 ms. Visiting it every other task bounds that
                // wait by the queue's length: /healthz's worst case went
                // from 151-341 ms to 81-100 ms (2048 connections, the
                // benches/shed.sh setup, noisy runs; BENCHMARKS.md
                // "Overload").
                .global_queue_interval(2)
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the runtime: {e}"))?;
            rt.block_on(service::serve(config))
        }
        Command::Replay { data_dir } => {
            let store: std::sync::Arc<dyn freqcap::store::Store> = match data_dir {
                Some(dir) => std::sync::Arc::new(
                    freqcap::store::RocksStore::open(&dir, Durability::Wal)
                        .map_err(|e| format!("{}: {e}", dir.display()))?,
                ),
                None => std::sync::Arc::new(freqcap::store::MemoryStore::new()),
            };
            let mut replayer = freqcap::replay::Replayer::new(
                store,
                freqcap::engine::EngineOptions::default(),
                freqcap::front::FrontOptions::default(),
            )?;
            let summary = replayer
                .run(
                    std::io::stdin().lock(),
                    std::io::BufWriter::new(std::io::stdout().lock()),
                )
                .map_err(|e| format!("replay: {e}"))?;
            eprintln!(
                "replayed {} lines, {} answered with an error status",
                summary.lines, summary.errors
            );
            Ok(())
        }
        Command::Validate { file } if freqcap::definitions_dir::is_definitions_dir(&file) => {
            // The same validation a reload does, on an engine in memory: every
            // file, and the parents among them.
            let engine = freqcap::engine::Engine::open(
                std::sync::Arc::new(freqcap::store::MemoryStore::new()),
                freqcap::SystemClock::new(),
                freqcap::engine::EngineOptions::default(),
            )
            .map_err(|e| e.to_string())?;
            let set = freqcap::definitions_dir::read(&file)?;
            let (p, c) = (set.policies.len(), set.campaigns.len());
            engine
                .replace_file_definitions(set)
                .map_err(|e| e.to_string())?;
            let _ = writeln!(std::io::stdout(), "{p} policies, {c} campaigns");
            Ok(())
        }
        Command::Validate { file } if is_rls(&file) => {
            let rules = if file.is_dir() {
                freqcap::rls::config::Rules::load_dir(&file)
            } else {
                let text = std::fs::read_to_string(&file)
                    .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
                freqcap::rls::config::Rules::parse(&[(file.display().to_string(), text)])
            }
            .map_err(|e| e.to_string())?;
            let mut domains: Vec<&String> = rules.domains.keys().collect();
            domains.sort();
            let _ = writeln!(
                std::io::stdout(),
                "{} rules in {} domains: {}",
                rules.count,
                domains.len(),
                domains
                    .iter()
                    .map(|d| d.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            Ok(())
        }
        Command::Validate { file } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            let toml = file.extension().is_some_and(|e| e == "toml");
            let def: PolicyDef = if toml {
                model::from_toml(&text)
            } else {
                model::from_json(&text)
            }
            .map_err(|e| format!("{}: {e}", file.display()))?;
            let compiled = def
                .compile()
                .map_err(|e| format!("{}: {e}", file.display()))?;
            for w in &compiled.warnings {
                eprintln!("warning: {}: {}", w.field, w.message);
            }
            let out = serde_json::to_string_pretty(&def).map_err(|e| e.to_string())?;
            // A closed pipe (`| head`) is not an error worth a panic.
            let _ = writeln!(std::io::stdout(), "{out}");
            Ok(())
        }
        Command::Simulate(cmd) => {
            let args = match (cmd.what, cmd.pacing) {
                (Some(SimulateWhat::Overload(a)), _) => {
                    let started = std::time::Instant::now();
                    let r = freqcap::simulate::overload::main(&a).map_err(|e| e.to_string())?;
                    eprintln!(
                        "{} runs and {} drift runs in {:.1} s; report in {}",
                        r.runs.len(),
                        r.drift.len(),
                        started.elapsed().as_secs_f64(),
                        a.out.display()
                    );
                    return Ok(());
                }
                (None, Some(args)) => args,
                (None, None) => {
                    return Err(
                        "simulate: give --campaigns and --out (pacing), or `overload`".into(),
                    );
                }
            };
            let s = freqcap::simulate::main(&args).map_err(|e| e.to_string())?;
            eprintln!(
                "simulated {} requests in {:.2} s ({:.0} per minute); report in {}",
                s.requests,
                s.wall_seconds,
                s.requests_per_minute,
                args.out.display()
            );
            Ok(())
        }
        Command::Forecast(args) => {
            let r = freqcap::simulate::forecast_main(&args).map_err(|e| e.to_string())?;
            let f = &r.forecast;
            let _ = write!(
                std::io::stdout(),
                "{}",
                freqcap::simulate::forecast::markdown(f, r.error.as_ref())
            );
            eprintln!(
                "forecast: {} of {} requests decided in {:.2} s{}; report in {}",
                f.sampled_requests,
                f.requests,
                f.wall_ms as f64 / 1000.0,
                r.full.as_ref().map_or(String::new(), |full| format!(
                    " (the whole traffic: {:.2} s)",
                    full.wall_ms as f64 / 1000.0
                )),
                args.sim.out.display()
            );
            Ok(())
        }
        Command::Schemas { out } => {
            std::fs::create_dir_all(&out)
                .map_err(|e| format!("cannot create {}: {e}", out.display()))?;
            let openapi = ("openapi.json", freqcap::api::openapi::document_text());
            for (name, text) in model::schemas().into_iter().chain([openapi]) {
                let path = out.join(name);
                std::fs::write(&path, text)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            }
            Ok(())
        }
    }
}

/// Whether `validate` was given Envoy rate limit rules: a directory, or a
/// YAML file.
fn is_rls(path: &std::path::Path) -> bool {
    path.is_dir() || path.extension().is_some_and(|e| e == "yaml" || e == "yml")
}
