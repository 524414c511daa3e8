//! Per-rule series of Envoy's rate limit service, opt-in
//! (`rls_rule_metrics`; docs/rls.md, "Metrics"): hits by domain and rule
//! key under the names envoyproxy/ratelimit's statistics take in Envoy
//! Gateway (`ratelimit_service_rate_limit_{total_hits,over_limit,
//! near_limit,within_limit,shadow_mode}`), and each rule's configured limit
//! (`freqcap_rls_rule_limit`).
//!
//! The names carry no `_total`: Envoy Gateway's come through a statsd
//! exporter, which adds none, and OpenMetrics counters must end in it, so
//! they are exported as gauges that only grow (`rate()` reads them the
//! same). At most [`MAX_SERIES`] (domain, key) pairs get series of their
//! own; a request's `limit` override names its key from the request, so
//! the rest share the key `_other`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// (domain, key) pairs with series of their own.
pub const MAX_SERIES: usize = 1000;

/// A hit past this share of its limit is also `near_limit`, as
/// envoyproxy/ratelimit's default `NEAR_LIMIT_RATIO` (0.8) says.
const NEAR_LIMIT: f64 = 0.8;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    domain: String,
    key: String,
}

/// The families, and whether they are filled.
#[derive(Debug, Clone, Default)]
pub struct RuleSeries {
    enabled: Arc<AtomicBool>,
    seen: Arc<Mutex<HashSet<(String, String)>>>,
    total_hits: Family<RuleLabels, Gauge>,
    over_limit: Family<RuleLabels, Gauge>,
    near_limit: Family<RuleLabels, Gauge>,
    within_limit: Family<RuleLabels, Gauge>,
    shadow_mode: Family<RuleLabels, Gauge>,
    limit: Family<RuleLabels, Gauge>,
}

/// One descriptor's decision, as the series count it.
pub struct Hit<'a> {
    pub domain: &'a str,
    pub key: &'a str,
    /// Its hits (`hits_addend`).
    pub hits: u64,
    pub allowed: bool,
    /// A shadow rule that was over (answered OK).
    pub shadow_over: bool,
    /// The rule's limit, and what remains of it after this call.
    pub limit: u64,
    pub remaining: u64,
}

impl RuleSeries {
    /// Registers the families in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        for (name, help, f) in [
            (
                "ratelimit_service_rate_limit_total_hits",
                "Hits by domain and rule key (rls_rule_metrics)",
                &self.total_hits,
            ),
            (
                "ratelimit_service_rate_limit_over_limit",
                "Hits over the limit",
                &self.over_limit,
            ),
            (
                "ratelimit_service_rate_limit_near_limit",
                "Hits within the limit past 80 % of it",
                &self.near_limit,
            ),
            (
                "ratelimit_service_rate_limit_within_limit",
                "Hits within the limit",
                &self.within_limit,
            ),
            (
                "ratelimit_service_rate_limit_shadow_mode",
                "Hits over the limit of a shadow-mode rule (answered OK)",
                &self.shadow_mode,
            ),
            (
                "freqcap_rls_rule_limit",
                "Each rule's configured limit, per its unit",
                &self.limit,
            ),
        ] {
            registry.register(name, help, f.clone());
        }
    }

    /// Fills the series from now on (`rls_rule_metrics = true`) or not.
    pub fn enable(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// Counts one descriptor's decision.
    pub fn record(&self, h: &Hit<'_>) {
        if !self.enabled.load(Ordering::Relaxed) {
            return;
        }
        let key = {
            let mut seen = self
                .seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let pair = (h.domain.to_owned(), h.key.to_owned());
            if seen.contains(&pair) || (seen.len() < MAX_SERIES && seen.insert(pair)) {
                h.key
            } else {
                "_other"
            }
        };
        let labels = RuleLabels {
            domain: h.domain.to_owned(),
            key: key.to_owned(),
        };
        let hits = i64::try_from(h.hits).unwrap_or(i64::MAX);
        let add = |f: &Family<RuleLabels, Gauge>| {
            f.get_or_create(&labels).inc_by(hits);
        };
        add(&self.total_hits);
        if h.allowed {
            add(&self.within_limit);
            let used = h.limit.saturating_sub(h.remaining) as f64;
            if h.limit > 0 && used > NEAR_LIMIT * h.limit as f64 {
                add(&self.near_limit);
            }
        } else {
            add(&self.over_limit);
        }
        if h.shadow_over {
            add(&self.shadow_mode);
        }
        self.limit
            .get_or_create(&labels)
            .set(i64::try_from(h.limit).unwrap_or(i64::MAX));
    }
}
