//! `/metrics`: Prometheus / OpenMetrics text (prometheus-client).
//!
//! Two kinds of figures:
//! - what the fronts see (HTTP requests by endpoint and status, latency,
//!   decisions, load shedding, each listener's connections, RESP commands,
//!   Envoy's rate limit calls, definition reloads), kept in this module's
//!   counters as requests happen;
//! - what the engine and store already count (reservations, commits, events,
//!   writer queue, hot tier, disk), read at scrape time by
//!   [`EngineFigures`] (`figures.rs`), so the request path pays nothing extra
//!   for them.
//!
//! `ops/alerts.yml` and `ops/RUNBOOK.md` name these metrics: renaming one is a
//! breaking change for operators.

use std::fmt;

use super::figures::EngineFigures;
use crate::server::ConnCounters;
use prometheus_client::encoding::{EncodeLabelSet, text::encode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds of the latency histogram's buckets, seconds.
const LATENCY_BUCKETS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

// Help texts are written without a final period: the registry adds one to
// what is registered, and `figures.rs` adds it to the collected ones.

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
    /// Calls naming a domain with no rules, answered OK
    /// (`rls_unknown_domain = "ok"`).
    pub unknown_domain: Counter,
    /// Rule reloads applied, and those refused (the previous rules stay).
    pub reloads: Counter,
    pub reload_failures: Counter,
    /// Rules loaded now.
    pub rules: Gauge,
    /// Per-rule series, when `rls_rule_metrics` is on.
    pub series: crate::rls::series::RuleSeries,
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

/// Counters the fronts update as requests happen.
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
    /// TLS on the listeners (`src/tls/`), when configured.
    pub tls: crate::tls::TlsCounters,
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
    /// A registry with the fronts' metrics and `figures` read per scrape.
    pub fn new(
        figures: EngineFigures,
        conns: &ConnCounters,
        tls_counters: &crate::tls::TlsCounters,
    ) -> Self {
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
            unknown_domain: Counter::default(),
            reloads: reload("applied"),
            reload_failures: reload("refused"),
            rules: Gauge::default(),
            series: Default::default(),
        };
        rls.series.register(&mut registry);
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
            "freqcap_rls_unknown_domain",
            "Envoy rate limit calls naming a domain with no rules, answered OK (rls_unknown_domain = ok)",
            rls.unknown_domain.clone(),
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
        let tls = tls_counters.clone();
        registry.register(
            "freqcap_tls_reloads",
            "TLS certificates reloaded (file change or SIGHUP)",
            tls.reloads.clone(),
        );
        registry.register(
            "freqcap_tls_reload_failures",
            "TLS certificate reloads refused (the certificates in force stay)",
            tls.reload_failures.clone(),
        );
        registry.register(
            "freqcap_tls_handshake_failures",
            "TLS handshakes failed: no or a bad client certificate, a protocol error, or past header_timeout_secs",
            tls.handshake_failures.clone(),
        );
        registry.register(
            "freqcap_tls_plaintext_refused",
            "Connections that spoke plaintext to a TLS port (told so and closed)",
            tls.plaintext_refused.clone(),
        );
        registry.register_collector(Box::new(figures));
        Metrics {
            tls,
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
