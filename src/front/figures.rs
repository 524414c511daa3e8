//! `/metrics`, the figures read at scrape time: what the engine and store
//! already count (reservations, commits, events, writer queue, hot tier,
//! disk, a shared store's calls), read by [`EngineFigures`] on each scrape so
//! the request path pays nothing extra for them. The live counters are in
//! [`super::metrics`].
//!
//! `ops/alerts.yml` and `ops/RUNBOOK.md` name these metrics: renaming one is a
//! breaking change for operators.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

// Help texts are written without a final period: `counter`, `gauge` and
// `family` add it.

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
    /// Hot keys this node learned were frozen: decided on leases since.
    pub hot_keys: u64,
    /// Owner mode: users claimed into memory, and decisions refused
    /// because a later owner had claimed the user.
    pub owner_claims: u64,
    pub owner_fenced: u64,
    /// Owner mode: heavy users placed by the fleet's table now.
    pub owner_heavy_users: u64,
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
    /// In a region (docs/regions.md): its grants from the global tier.
    pub region: Option<crate::engine::RegionFigures>,
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
        reservations_and_events(&mut e, &f)?;
        writer_and_store(&mut e, &f)?;
        counter(
            &mut e,
            "freqcap_erasures",
            "Viewers erased (DELETE /v1/users/{user} or /v1/ids/{kind}/{id}), whether or not they had records",
            f.erasures,
        )?;
        definitions(&mut e, &f.definitions)?;
        if let Some(g) = &f.region {
            region(&mut e, g)?;
        }
        let Some(r) = f.redis else {
            return Ok(());
        };
        shared_store(&mut e, &f, &r)?;
        redis_calls(&mut e, &r)
    }
}

/// A region's calls to the global tier (docs/regions.md).
fn region(e: &mut DescriptorEncoder, g: &crate::engine::RegionFigures) -> fmt::Result {
    counter(
        e,
        "freqcap_region_syncs",
        "Calls to the global tier that renewed a grant of this node's region (docs/regions.md)",
        g.syncs,
    )?;
    counter(
        e,
        "freqcap_region_sync_failures",
        "Calls to the global tier that failed (unreachable: the region's grant, then its safe capacity, is used)",
        g.failures,
    )?;
    gauge(
        e,
        "freqcap_region_items",
        "Campaign items this node's region leases from the global tier",
        g.items as u64,
    )?;
    gauge(
        e,
        "freqcap_region_reachable",
        "1 if the global tier answered within the last 2 s, else 0",
        u64::from(g.reachable),
    )?;
    gauge(
        e,
        "freqcap_region_caller",
        "1 if this node renews its region's grants at the global tier for the region (docs/regions.md, \"One caller per region\"), else 0",
        u64::from(g.caller),
    )?;
    gauge(
        e,
        "freqcap_region_users",
        "Users this node follows across regions (docs/regions.md, \"Users across regions\")",
        g.users as u64,
    )?;
    counter(
        e,
        "freqcap_region_held",
        "Screens held back until the user's home region counted this node's last unit",
        g.held,
    )?;
    counter(
        e,
        "freqcap_region_applied",
        "Units other regions counted for users, applied to this region's records",
        g.applied,
    )
}

/// Reservations, commits, releases and events: what the decisions did.
fn reservations_and_events(e: &mut DescriptorEncoder, f: &Figures) -> fmt::Result {
    gauge(
        e,
        "freqcap_reservations_open",
        "Reservations pending now",
        f.reservations_open,
    )?;
    counter(
        e,
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
    ConstCounter::new(f.late_commits).encode(m.encode_family(&[("outcome", "late_commit")])?)?;
    counter(
        e,
        "freqcap_releases",
        "Reservations released by a client",
        f.releases,
    )?;
    counter(e, "freqcap_events", "Events counted", f.events)?;
    counter(
        e,
        "freqcap_events_duplicate",
        "Events ignored as already counted within the dedupe horizon",
        f.duplicate_events,
    )?;
    Ok(())
}

/// The writer, the hot tier and RocksDB: where the state goes and what it
/// costs (every store reports them; 0 where they do not apply).
fn writer_and_store(e: &mut DescriptorEncoder, f: &Figures) -> fmt::Result {
    gauge(
        e,
        "freqcap_writer_queue_depth",
        "Batches submitted to the writer and not yet written",
        f.writer_queue_depth,
    )?;
    counter(
        e,
        "freqcap_writer_groups",
        "Groups written (one WAL append each)",
        f.writer_groups,
    )?;
    counter(
        e,
        "freqcap_writer_batches",
        "Batches written; batches / groups is the mean group size",
        f.writer_batches,
    )?;
    gauge(
        e,
        "freqcap_hot_records",
        "Records in the hot tier",
        f.hot_records,
    )?;
    gauge(
        e,
        "freqcap_hot_bytes",
        "Bytes the hot tier counts against its budget",
        f.hot_bytes,
    )?;
    counter(
        e,
        "freqcap_hot_hits",
        "Record lookups served from memory",
        f.hot_hits,
    )?;
    counter(
        e,
        "freqcap_hot_misses",
        "Record lookups that asked the store",
        f.hot_misses,
    )?;
    gauge(
        e,
        "freqcap_disk_live_bytes",
        "RocksDB's estimate of live state bytes (0 in memory)",
        f.disk_live_bytes,
    )?;
    gauge(
        e,
        "freqcap_rocksdb_memtable_bytes",
        "Bytes in RocksDB's memtables (0 in memory)",
        f.rocksdb_memtable_bytes,
    )?;
    gauge(
        e,
        "freqcap_rocksdb_pending_compaction_bytes",
        "Bytes RocksDB estimates compaction has yet to rewrite (0 in memory)",
        f.rocksdb_pending_compaction_bytes,
    )?;
    gauge(
        e,
        "freqcap_rocksdb_estimated_keys",
        "RocksDB's estimate of keys of state (0 in memory)",
        f.rocksdb_estimated_keys,
    )?;
    Ok(())
}

/// A shared store's own figures (docs/cluster.md): compare-and-set, owner
/// mode, fail-open, leases and grants, and the cluster's clock.
fn shared_store(e: &mut DescriptorEncoder, f: &Figures, r: &RedisFigures) -> fmt::Result {
    counter(
        e,
        "freqcap_cas",
        "Records written by compare-and-set to the shared store",
        f.cas,
    )?;
    counter(
        e,
        "freqcap_cas_conflicts",
        "Compare-and-set writes another node's write beat (decided again)",
        f.cas_conflicts,
    )?;
    counter(
        e,
        "freqcap_hot_keys",
        "Policy keys this node learned were hot (frozen in the store, decided on leases since; docs/cluster.md \"Hot keys\")",
        f.hot_keys,
    )?;
    counter(
        e,
        "freqcap_owner_claims",
        "Owner mode: users claimed into this node's memory (read from the shared store)",
        f.owner_claims,
    )?;
    counter(
        e,
        "freqcap_owner_fenced",
        "Owner mode: decisions refused because a later owner had claimed the user",
        f.owner_fenced,
    )?;
    gauge(
        e,
        "freqcap_owner_heavy_users",
        "Owner mode: users placed with bounded loads by the fleet's table of heavy users in force",
        f.owner_heavy_users,
    )?;
    counter(
        e,
        "freqcap_screens_failed_open",
        "Screens answered eligible because the user's record could not be reached (fail_open)",
        f.failed_open,
    )?;
    counter(
        e,
        "freqcap_identity_recheck_denials",
        "Candidates denied when held on another identity's record (a household's) that another screen filled since it was read",
        f.identity_rechecks,
    )?;
    counter(
        e,
        "freqcap_lease_calls",
        "Calls of the lease function (grants of campaign-scope state, spend reports)",
        f.lease_calls,
    )?;
    counter(
        e,
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
        e,
        "freqcap_grants",
        "Grants of campaign-scope state this node holds",
        f.grants,
    )?;
    gauge(
        e,
        "freqcap_grant_units_outstanding",
        "Units granted to this node and not reported spent",
        f.grant_units,
    )?;
    gauge(
        e,
        "freqcap_unreported_units",
        "Units committed on this node and not yet reported to the fleet (other nodes' delivery, usage and timelines lack them); each is reported within a second of its commit",
        f.unreported_units,
    )?;
    gauge(
        e,
        "freqcap_reservations_unsettled",
        "Reservations past their deadline whose record could not be read yet; their campaign-side holds stay until it is",
        f.unsettled,
    )?;
    Ok(())
}

/// The calls to Redis: counts by failure, and their latency histogram.
fn redis_calls(e: &mut DescriptorEncoder, r: &RedisFigures) -> fmt::Result {
    counter(e, "freqcap_redis_calls", "Calls to Redis", r.calls)?;
    counter(
        e,
        "freqcap_redis_errors",
        "Calls to Redis that failed (connection, cluster down, an error reply)",
        r.errors,
    )?;
    counter(
        e,
        "freqcap_redis_timeouts",
        "Calls to Redis past their deadline",
        r.timeouts,
    )?;
    counter(
        e,
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
