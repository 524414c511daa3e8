//! `/metrics`: Prometheus / OpenMetrics text (prometheus-client).
//!
//! Two kinds of figures:
//! - what the HTTP layer sees (requests by endpoint and status, latency,
//!   decisions, load shedding), kept in this module's counters as requests
//!   happen;
//! - what the engine and store already count (reservations, commits, events,
//!   writer queue, hot tier, disk), read at scrape time by [`EngineFigures`],
//!   so the request path pays nothing extra for them.
//!
//! `ops/alerts.yml` and `ops/RUNBOOK.md` name these metrics: renaming one is a
//! breaking change for operators.

use std::fmt;

use crate::server::ConnCounters;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, text::encode};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds of the latency histogram's buckets, seconds.
const LATENCY_BUCKETS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

// Help texts are written without a final period: the registry adds one to
// what is registered, and `counter`/`gauge` add it to the collected ones.

/// The content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    /// The route template (`/v1/campaigns/{id}`), never the raw path, so the
    /// number of series stays bounded whatever ids clients send.
    endpoint: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabels {
    /// One of the RESP front's commands, or `other` (`src/resp/cmd/mod.rs`).
    command: &'static str,
    /// `ok`, or `error` for an error reply.
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    endpoint: &'static str,
    outcome: &'static str,
}

/// RESP connections the server closed for what they sent (`src/resp/`),
/// beside protocol errors and timeouts.
#[derive(Debug, Clone, Default)]
pub struct RespClosed {
    /// A command named `POST` or `Host:`: an HTTP request, as a browser
    /// sends it when a web page attacks the port (cross-protocol scripting).
    pub cross_protocol: Counter,
    /// Too many failed `AUTH`s on one connection.
    pub auth_failures: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// Figures of Envoy's rate limit service (`src/rls/`), shared between it and
/// the registry.
#[derive(Debug, Clone, Default)]
pub struct RlsCounters {
    /// ShouldRateLimit calls answered OK.
    pub ok: Counter,
    /// ShouldRateLimit calls answered OVER_LIMIT.
    pub over_limit: Counter,
    /// ShouldRateLimit calls answered with an error status.
    pub error: Counter,
    /// Shadow-mode descriptors that were over their limit (answered OK).
    pub shadow_over: Counter,
    /// Rule reloads applied, and those refused (the previous rules stay).
    pub reloads: Counter,
    pub reload_failures: Counter,
    /// Rules loaded now.
    pub rules: Gauge,
}

/// Reloads of the definitions directory (`src/definitions_dir.rs`).
#[derive(Debug, Clone, Default)]
pub struct DefinitionReloads {
    /// Reloads applied (the directory's set is in force).
    pub applied: Counter,
    /// Reloads refused (the previous definitions stay).
    pub errors: Counter,
}

/// Upper bounds of the queueing-delay histogram's buckets, seconds.
const QUEUE_BUCKETS: [f64; 10] = [
    0.000_1, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
];

/// Counters the HTTP layer updates as requests happen.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<EndpointLabel, Histogram>,
    decisions: Family<DecisionLabels, Counter>,
    overloaded: Family<ReasonLabel, Counter>,
    queue_delay: Histogram,
    /// Requests being handled now. It is also the load-shedding counter: one
    /// atomic serves both, so the gauge is exactly what the guard compares.
    pub in_flight: Gauge,
    /// Decisions waiting for an in-flight slot (`front::admission`).
    pub waiting: Gauge,
    resp_commands: Family<CommandLabels, Counter>,
    /// The RESP listener's connections (`src/resp/mod.rs`).
    pub resp_connections: ConnCounters,
    /// RESP connections closed on a frame that could not be read.
    pub resp_protocol_errors: Counter,
    /// RESP connections closed for what they sent, by reason.
    pub resp_closed: RespClosed,
    /// Envoy's rate limit service.
    pub rls: RlsCounters,
    /// The gRPC listener's connections (`src/grpc/mod.rs`).
    pub grpc_connections: ConnCounters,
    /// Reloads of the definitions directory.
    pub definition_reloads: DefinitionReloads,
}

/// The engine's and store's own figures at scrape time.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    pub reservations_open: u64,
    pub reservations_expired: u64,
    pub commits: u64,
    pub late_commits: u64,
    pub releases: u64,
    pub events: u64,
    pub duplicate_events: u64,
    pub writer_queue_depth: u64,
    pub writer_groups: u64,
    pub writer_batches: u64,
    pub hot_records: u64,
    pub hot_bytes: u64,
    pub hot_hits: u64,
    pub hot_misses: u64,
    pub disk_live_bytes: u64,
    pub rocksdb_memtable_bytes: u64,
    pub rocksdb_pending_compaction_bytes: u64,
    pub rocksdb_estimated_keys: u64,
    /// With a shared store (docs/cluster.md): compare-and-set writes, those
    /// that met another node's write first, and screens answered open.
    pub cas: u64,
    pub cas_conflicts: u64,
    /// Owner mode: users claimed into memory, and decisions refused
    /// because a later owner had claimed the user.
    pub owner_claims: u64,
    pub owner_fenced: u64,
    pub failed_open: u64,
    pub identity_rechecks: u64,
    /// Viewers erased (`DELETE /v1/users/{user}`, `/v1/ids/{kind}/{id}`).
    pub erasures: u64,
    /// Lease calls, and this node's grants now (count, units not yet spent).
    pub lease_calls: u64,
    /// Decisions on a record whose own time ran more than 1 s past the
    /// cluster's (written by a node on its own wrong clock), held up by 1 s.
    pub record_time_capped: u64,
    pub grants: u64,
    /// Units committed here and not reported yet (a shared store).
    pub unreported_units: u64,
    pub grant_units: u64,
    /// Reservations past their deadline whose record could not be read yet
    /// (their campaign-side holds stay until it is).
    pub unsettled: u64,
    pub redis: Option<RedisFigures>,
    /// The chosen campaigns and policies (docs/service.md, "Per-definition
    /// metrics").
    pub definitions: crate::engine::DefinitionFigures,
}

/// A Redis Cluster store's calls (docs/cluster.md, metrics).
#[derive(Debug, Default, Clone, Copy)]
pub struct RedisFigures {
    pub calls: u64,
    pub errors: u64,
    pub timeouts: u64,
    pub unreplicated: u64,
    /// Redis's time minus this node's clock, ns, as last measured
    /// (src/cluster/time.rs): the shift its decisions use.
    pub clock_offset_ns: i64,
    pub latency_sum_us: u64,
    /// Calls per latency bucket ([`crate::store::shared::LATENCY_BOUNDS_US`], then
    /// the rest), not cumulative.
    pub buckets: [u64; 10],
}

/// Reads [`Figures`] on each scrape. A closure keeps this module free of the
/// engine's clock type parameter.
pub struct EngineFigures(pub Box<dyn Fn() -> Figures + Send + Sync>);

impl fmt::Debug for EngineFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EngineFigures")
    }
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, &format!("{help}."), None, c.metric_type())?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    let g = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
    g.encode(e.encode_descriptor(name, &format!("{help}."), None, g.metric_type())?)
}

/// A family of series, one per (labels, value).
fn family<'a>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: prometheus_client::metrics::MetricType,
    series: impl IntoIterator<Item = (Vec<(&'static str, &'a str)>, u64)>,
) -> fmt::Result {
    let mut series = series.into_iter().peekable();
    if series.peek().is_none() {
        return Ok(());
    }
    let mut d = e.encode_descriptor(name, &format!("{help}."), None, kind)?;
    for (labels, v) in series {
        let m = d.encode_family(&labels)?;
        match kind {
            prometheus_client::metrics::MetricType::Counter => ConstCounter::new(v).encode(m)?,
            _ => ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(m)?,
        }
    }
    Ok(())
}

/// The per-campaign and per-policy series (opt-in, bounded: see
/// docs/service.md, "Per-definition metrics").
fn definitions(e: &mut DescriptorEncoder, d: &crate::engine::DefinitionFigures) -> fmt::Result {
    use prometheus_client::metrics::MetricType::{Counter as C, Gauge as G};
    let cs = &d.campaigns;
    family(
        e,
        "freqcap_campaign_screened",
        "Candidates of a campaign found eligible, or eligible in shadow mode only (outcome would_deny)",
        C,
        cs.iter().flat_map(|c| {
            [
                (
                    vec![("campaign", c.campaign.as_str()), ("outcome", "eligible")],
                    c.eligible,
                ),
                (
                    vec![("campaign", c.campaign.as_str()), ("outcome", "would_deny")],
                    c.would_deny,
                ),
            ]
        }),
    )?;
    family(
        e,
        "freqcap_campaign_denied",
        "Candidates denied by a campaign's cap (budget, max_in_flight and unknown_user included)",
        C,
        cs.iter().flat_map(|c| {
            c.denied.iter().map(|(cap, n)| {
                (
                    vec![("campaign", c.campaign.as_str()), ("cap", cap.as_str())],
                    *n,
                )
            })
        }),
    )?;
    family(
        e,
        "freqcap_campaign_commits",
        "Commits won by a candidate of a campaign",
        C,
        cs.iter()
            .map(|c| (vec![("campaign", c.campaign.as_str())], c.commits)),
    )?;
    family(
        e,
        "freqcap_campaign_reservations_open",
        "Open screen reservations holding a candidate of a campaign",
        G,
        cs.iter()
            .map(|c| (vec![("campaign", c.campaign.as_str())], c.reservations_open)),
    )?;
    let budgets = || {
        cs.iter()
            .filter_map(|c| Some((c.campaign.as_str(), c.budget?)))
    };
    family(
        e,
        "freqcap_campaign_budget",
        "A campaign's budget for the period",
        G,
        budgets().map(|(c, b)| (vec![("campaign", c)], b.amount)),
    )?;
    family(
        e,
        "freqcap_campaign_spend",
        "A campaign's committed spend this period",
        G,
        budgets().map(|(c, b)| (vec![("campaign", c)], b.spent)),
    )?;
    family(
        e,
        "freqcap_campaign_spend_cap_now",
        "What a campaign's pacing allows to have been spent by now (the pacing line)",
        G,
        budgets().map(|(c, b)| (vec![("campaign", c)], b.cap_now)),
    )?;
    family(
        e,
        "freqcap_campaign_spend_pending",
        "A campaign's spend held by open reservations",
        G,
        budgets().map(|(c, b)| (vec![("campaign", c)], b.pending)),
    )?;
    family(
        e,
        "freqcap_policy_decisions",
        "Checks of a named policy by outcome (allowed, denied, would_deny)",
        C,
        d.policies.iter().flat_map(|p| {
            [
                (
                    vec![("policy", p.policy.as_str()), ("outcome", "allowed")],
                    p.allowed,
                ),
                (
                    vec![("policy", p.policy.as_str()), ("outcome", "denied")],
                    p.denied,
                ),
                (
                    vec![("policy", p.policy.as_str()), ("outcome", "would_deny")],
                    p.would_deny,
                ),
            ]
        }),
    )?;
    family(
        e,
        "freqcap_policy_adaptive_limit",
        "The limit of a policy's adaptive item in its last decision (its key's, for a policy of one key)",
        G,
        d.policies
            .iter()
            .filter_map(|p| Some((vec![("policy", p.policy.as_str())], p.adaptive_limit?))),
    )
}

impl Collector for EngineFigures {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let f = (self.0)();
        gauge(
            &mut e,
            "freqcap_reservations_open",
            "Reservations pending now",
            f.reservations_open,
        )?;
        counter(
            &mut e,
            "freqcap_reservations_expired",
            "Reservations released by their deadline",
            f.reservations_expired,
        )?;
        // Commits by outcome: one family, two series.
        let committed = ConstCounter::new(f.commits);
        let mut m = e.encode_descriptor(
            "freqcap_commits",
            "Commits by outcome (committed: of a live reservation; late_commit: of an unknown or expired one).",
            None,
            committed.metric_type(),
        )?;
        committed.encode(m.encode_family(&[("outcome", "committed")])?)?;
        ConstCounter::new(f.late_commits)
            .encode(m.encode_family(&[("outcome", "late_commit")])?)?;
        counter(
            &mut e,
            "freqcap_releases",
            "Reservations released by a client",
            f.releases,
        )?;
        counter(&mut e, "freqcap_events", "Events counted", f.events)?;
        counter(
            &mut e,
            "freqcap_events_duplicate",
            "Events ignored as already counted within the dedupe horizon",
            f.duplicate_events,
        )?;
        gauge(
            &mut e,
            "freqcap_writer_queue_depth",
            "Batches submitted to the writer and not yet written",
            f.writer_queue_depth,
        )?;
        counter(
            &mut e,
            "freqcap_writer_groups",
            "Groups written (one WAL append each)",
            f.writer_groups,
        )?;
        counter(
            &mut e,
            "freqcap_writer_batches",
            "Batches written; batches / groups is the mean group size",
            f.writer_batches,
        )?;
        gauge(
            &mut e,
            "freqcap_hot_records",
            "Records in the hot tier",
            f.hot_records,
        )?;
        gauge(
            &mut e,
            "freqcap_hot_bytes",
            "Bytes the hot tier counts against its budget",
            f.hot_bytes,
        )?;
        counter(
            &mut e,
            "freqcap_hot_hits",
            "Record lookups served from memory",
            f.hot_hits,
        )?;
        counter(
            &mut e,
            "freqcap_hot_misses",
            "Record lookups that asked the store",
            f.hot_misses,
        )?;
        gauge(
            &mut e,
            "freqcap_disk_live_bytes",
            "RocksDB's estimate of live state bytes (0 in memory)",
            f.disk_live_bytes,
        )?;
        gauge(
            &mut e,
            "freqcap_rocksdb_memtable_bytes",
            "Bytes in RocksDB's memtables (0 in memory)",
            f.rocksdb_memtable_bytes,
        )?;
        gauge(
            &mut e,
            "freqcap_rocksdb_pending_compaction_bytes",
            "Bytes RocksDB estimates compaction has yet to rewrite (0 in memory)",
            f.rocksdb_pending_compaction_bytes,
        )?;
        gauge(
            &mut e,
            "freqcap_rocksdb_estimated_keys",
            "RocksDB's estimate of keys of state (0 in memory)",
            f.rocksdb_estimated_keys,
        )?;
        counter(
            &mut e,
            "freqcap_erasures",
            "Viewers erased (DELETE /v1/users/{user} or /v1/ids/{kind}/{id}), whether or not they had records",
            f.erasures,
        )?;
        definitions(&mut e, &f.definitions)?;
        let Some(r) = f.redis else {
            return Ok(());
        };
        counter(
            &mut e,
            "freqcap_cas",
            "Records written by compare-and-set to the shared store",
            f.cas,
        )?;
        counter(
            &mut e,
            "freqcap_cas_conflicts",
            "Compare-and-set writes another node's write beat (decided again)",
            f.cas_conflicts,
        )?;
        counter(
            &mut e,
            "freqcap_owner_claims",
            "Owner mode: users claimed into this node's memory (read from the shared store)",
            f.owner_claims,
        )?;
        counter(
            &mut e,
            "freqcap_owner_fenced",
            "Owner mode: decisions refused because a later owner had claimed the user",
            f.owner_fenced,
        )?;
        counter(
            &mut e,
            "freqcap_screens_failed_open",
            "Screens answered eligible because the user's record could not be reached (fail_open)",
            f.failed_open,
        )?;
        counter(
            &mut e,
            "freqcap_identity_recheck_denials",
            "Candidates denied when held on another identity's record (a household's) that another screen filled since it was read",
            f.identity_rechecks,
        )?;
        counter(
            &mut e,
            "freqcap_lease_calls",
            "Calls of the lease function (grants of campaign-scope state, spend reports)",
            f.lease_calls,
        )?;
        counter(
            &mut e,
            "freqcap_cluster_record_time_capped",
            "Decisions on a record whose own time ran more than 1 s past the cluster's (a node decided on its own wrong clock), held up by 1 s only",
            f.record_time_capped,
        )?;
        {
            // Seconds, so a dashboard compares it with its alert threshold
            // (docs/cluster.md: warn past 1 s) directly.
            let g = ConstGauge::new(r.clock_offset_ns as f64 / 1e9);
            g.encode(e.encode_descriptor(
                "freqcap_cluster_clock_offset_seconds",
                "Redis's time minus this node's clock, as last measured; decisions use Redis's (negative: this node's clock is ahead).",
                None,
                g.metric_type(),
            )?)?;
        }
        gauge(
            &mut e,
            "freqcap_grants",
            "Grants of campaign-scope state this node holds",
            f.grants,
        )?;
        gauge(
            &mut e,
            "freqcap_grant_units_outstanding",
            "Units granted to this node and not reported spent",
            f.grant_units,
        )?;
        gauge(
            &mut e,
            "freqcap_unreported_units",
            "Units committed on this node and not yet reported to the fleet (other nodes' delivery, usage and timelines lack them); each is reported within a second of its commit",
            f.unreported_units,
        )?;
        gauge(
            &mut e,
            "freqcap_reservations_unsettled",
            "Reservations past their deadline whose record could not be read yet; their campaign-side holds stay until it is",
            f.unsettled,
        )?;
        counter(&mut e, "freqcap_redis_calls", "Calls to Redis", r.calls)?;
        counter(
            &mut e,
            "freqcap_redis_errors",
            "Calls to Redis that failed (connection, cluster down, an error reply)",
            r.errors,
        )?;
        counter(
            &mut e,
            "freqcap_redis_timeouts",
            "Calls to Redis past their deadline",
            r.timeouts,
        )?;
        counter(
            &mut e,
            "freqcap_redis_unreplicated",
            "Writes no replica confirmed in time (durability replicated or fsync): not acknowledged",
            r.unreplicated,
        )?;
        let mut cumulative = 0;
        let buckets: Vec<(f64, u64)> = r
            .buckets
            .iter()
            .enumerate()
            .map(|(i, n)| {
                cumulative += n;
                let le = crate::store::shared::LATENCY_BOUNDS_US
                    .get(i)
                    .map_or(f64::INFINITY, |us| *us as f64 / 1e6);
                (le, cumulative)
            })
            .collect();
        let mut h = e.encode_descriptor(
            "freqcap_redis_call_seconds",
            "Latency of calls to Redis, deadline included.",
            None,
            prometheus_client::metrics::MetricType::Histogram,
        )?;
        h.encode_histogram::<Vec<(String, String)>>(
            r.latency_sum_us as f64 / 1e6,
            cumulative,
            &buckets,
            None,
        )?;
        Ok(())
    }
}

/// A listener's figures as `freqcap_<front>_connections_open`, `_refused`
/// and `_timed_out`, with their help texts in that order.
fn register_conns(registry: &mut Registry, front: &str, c: &ConnCounters, help: [&str; 3]) {
    let [open, refused, timed_out] = help;
    let name = |what: &str| format!("freqcap_{front}_connections_{what}");
    registry.register(name("open"), open, c.open.clone());
    registry.register(name("refused"), refused, c.refused.clone());
    registry.register(name("timed_out"), timed_out, c.timed_out.clone());
}

impl Metrics {
    /// A registry with the HTTP layer's metrics and `figures` read per scrape.
    pub fn new(figures: EngineFigures, conns: &ConnCounters) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        // 50 µs to 5 s in 1-2.5-5 steps: decisions take microseconds, commits
        // with fsync milliseconds; 1 ms and 5 ms are bucket bounds, so
        // latency objectives read exactly.
        let latency = Family::<EndpointLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(LATENCY_BUCKETS.iter().copied())
        });
        let decisions = Family::<DecisionLabels, Counter>::default();
        let overloaded = Family::<ReasonLabel, Counter>::default();
        // Every reason exported from the start (at 0), so a rate over it
        // has a series before the first shed.
        for reason in [
            "queue_delay",
            "cpu",
            "in_flight",
            "connections",
            "reservations",
            "body_memory",
        ] {
            let _ = overloaded.get_or_create(&ReasonLabel { reason });
        }
        let queue_delay = Histogram::new(QUEUE_BUCKETS.iter().copied());
        let in_flight = Gauge::default();
        let waiting = Gauge::default();
        registry.register(
            "freqcap_http_requests",
            "HTTP requests by route and status",
            requests.clone(),
        );
        registry.register(
            "freqcap_http_request_duration_seconds",
            "Time from the request entering the router to its answer",
            latency.clone(),
        );
        registry.register(
            "freqcap_decisions",
            "Decisions: check by outcome (allowed, denied, delayed); screen per candidate (eligible, ineligible)",
            decisions.clone(),
        );
        registry.register(
            "freqcap_overloaded",
            "Requests answered 503 overloaded by load shedding, by reason (queue_delay, in_flight, connections, reservations, body_memory)",
            overloaded.clone(),
        );
        registry.register(
            "freqcap_queue_delay_seconds",
            "How long a request's connection waited to run once its bytes arrived (what load shedding compares)",
            queue_delay.clone(),
        );
        register_conns(
            &mut registry,
            "http",
            conns,
            [
                "HTTP connections open now",
                "HTTP connections closed at accept, over max_connections and the probe reserve",
                "HTTP connections closed for idling, or sending a request head too slowly",
            ],
        );
        registry.register(
            "freqcap_in_flight_requests",
            "Requests being handled now",
            in_flight.clone(),
        );
        registry.register(
            "freqcap_waiting_requests",
            "Decisions waiting for an in-flight slot past max_in_flight (adaptive LIFO, docs/service.md)",
            waiting.clone(),
        );
        let resp_commands = Family::<CommandLabels, Counter>::default();
        let resp_connections = ConnCounters::default();
        let resp_protocol_errors = Counter::default();
        registry.register(
            "freqcap_resp_commands",
            "RESP commands by command and outcome (ok, error)",
            resp_commands.clone(),
        );
        register_conns(
            &mut registry,
            "resp",
            &resp_connections,
            [
                "RESP connections open now",
                "RESP connections closed at accept, over resp_max_connections",
                "RESP connections closed for idling, or sending a command too slowly",
            ],
        );
        registry.register(
            "freqcap_resp_protocol_errors",
            "RESP connections closed on a frame that could not be read",
            resp_protocol_errors.clone(),
        );
        let closed = Family::<ReasonLabel, Counter>::default();
        let closed_for = |reason| closed.get_or_create(&ReasonLabel { reason }).clone();
        let resp_closed = RespClosed {
            cross_protocol: closed_for("cross_protocol"),
            auth_failures: closed_for("auth_failures"),
        };
        registry.register(
            "freqcap_resp_connections_closed",
            "RESP connections closed for what they sent, by reason (cross_protocol: an HTTP request; auth_failures: too many failed AUTH)",
            closed,
        );
        let definition_reloads = DefinitionReloads::default();
        registry.register(
            "freqcap_definitions_reloads",
            "Reloads of the definitions directory applied",
            definition_reloads.applied.clone(),
        );
        registry.register(
            "freqcap_definitions_reload_errors",
            "Reloads of the definitions directory refused (the previous definitions stay)",
            definition_reloads.errors.clone(),
        );
        let grpc_connections = ConnCounters::default();
        register_conns(
            &mut registry,
            "grpc",
            &grpc_connections,
            [
                "gRPC connections open now",
                "gRPC connections closed at accept, over grpc_max_connections",
                "gRPC connections closed for sending nothing within header_timeout_secs",
            ],
        );
        let rls_calls = Family::<OutcomeLabel, Counter>::default();
        let reloads = Family::<OutcomeLabel, Counter>::default();
        let call = |outcome| rls_calls.get_or_create(&OutcomeLabel { outcome }).clone();
        let reload = |outcome| reloads.get_or_create(&OutcomeLabel { outcome }).clone();
        let rls = RlsCounters {
            ok: call("ok"),
            over_limit: call("over_limit"),
            error: call("error"),
            shadow_over: Counter::default(),
            reloads: reload("applied"),
            reload_failures: reload("refused"),
            rules: Gauge::default(),
        };
        registry.register(
            "freqcap_rls_requests",
            "Envoy rate limit calls by outcome (ok, over_limit, error)",
            rls_calls,
        );
        registry.register(
            "freqcap_rls_shadow_over_limit",
            "Shadow-mode descriptors over their limit, answered OK",
            rls.shadow_over.clone(),
        );
        registry.register(
            "freqcap_rls_config_reloads",
            "Envoy rate limit rule reloads by outcome (applied, refused: the previous rules stay)",
            reloads,
        );
        registry.register(
            "freqcap_rls_rules",
            "Envoy rate limit rules loaded now",
            rls.rules.clone(),
        );
        registry.register_collector(Box::new(figures));
        Metrics {
            definition_reloads,
            rls,
            grpc_connections,
            resp_commands,
            resp_connections,
            resp_protocol_errors,
            resp_closed,
            registry,
            requests,
            latency,
            decisions,
            overloaded,
            queue_delay,
            in_flight,
            waiting,
        }
    }

    /// Counts one answered request.
    pub fn request(&self, endpoint: &'static str, status: u16, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels { endpoint, status })
            .inc();
        self.latency
            .get_or_create(&EndpointLabel { endpoint })
            .observe(seconds);
    }

    /// Counts `n` decisions of `outcome` at `endpoint`.
    pub fn decisions(&self, endpoint: &'static str, outcome: &'static str, n: u64) {
        if n > 0 {
            self.decisions
                .get_or_create(&DecisionLabels { endpoint, outcome })
                .inc_by(n);
        }
    }

    /// The counter of RESP `command`s answered ok or not: a handle the
    /// front keeps, so counting is one atomic add (a family lookup per
    /// command took ~1 % of a core at 500 000 commands/s).
    pub fn resp_command_counter(&self, command: &'static str, ok: bool) -> Counter {
        let outcome = if ok { "ok" } else { "error" };
        self.resp_commands
            .get_or_create(&CommandLabels { command, outcome })
            .clone()
    }

    /// The counter of decisions of `outcome` at `endpoint`, as a handle.
    pub fn decisions_counter(&self, endpoint: &'static str, outcome: &'static str) -> Counter {
        self.decisions
            .get_or_create(&DecisionLabels { endpoint, outcome })
            .clone()
    }

    /// Counts a request shed for `reason`.
    pub fn overloaded(&self, reason: &'static str) {
        self.overloaded.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// The counter of sheds for `reason`, for a part that counts its own.
    pub fn overloaded_counter(&self, reason: &'static str) -> Counter {
        self.overloaded
            .get_or_create(&ReasonLabel { reason })
            .clone()
    }

    /// Notes a request's queueing delay.
    pub fn queue_delay(&self, seconds: f64) {
        self.queue_delay.observe(seconds);
    }

    /// The exposition text.
    pub fn render(&self) -> Result<String, fmt::Error> {
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
