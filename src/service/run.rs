//! The server's life: [`serve`] opens the store and the engine, loads the
//! definitions, binds the listeners, joins the fleet (owner mode), serves
//! until SIGTERM or SIGINT, then drains and flushes. Each step is a function
//! below, called in this order: the order is part of the behaviour (what is
//! bound before the "listening" line, what is flushed before what).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::ServeConfig;
use crate::api::{self, AppState};
use crate::clock::SystemClock;
use crate::engine::{Engine, EngineOptions, Fleet};
use crate::front::FrontOptions;
use crate::rls::RulesHandle;
use crate::server::ConnCounters;
use crate::server::{self, ConnLimits};
use crate::store::{MemoryStore, RocksOptions, RocksStore, Store};
use crate::tls::Tls;

/// The engine every front and background task shares.
type SharedEngine = Arc<Engine<SystemClock>>;

/// The region's renewals (docs/regions.md): their stop flag and task.
type RegionTicks = (Arc<std::sync::atomic::AtomicBool>, JoinHandle<()>);

/// Owner mode's membership renewer: its stop flag and its thread.
type Membership = (
    Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<()>,
);

/// Runs the service until SIGTERM/SIGINT: stops accepting, drains requests in
/// flight, then flushes the writer.
pub async fn serve(config: ServeConfig) -> Result<(), String> {
    config.check()?;
    // ring as the process's TLS provider: the Redis client's `rediss://`
    // asks for the default one.
    crate::tls::install_provider();
    for w in config.warnings() {
        tracing::warn!("{w}");
    }
    let node_id = node_id(&config);
    // Before connecting anywhere: a bad certificate is said at once.
    let tls = open_tls(&config)?;
    // Bound first: in owner mode the engine opens knowing the address other
    // nodes forward its users to, the listener's when `listen` asks for any
    // port. Nothing is accepted before the "listening" line below.
    let (listener, addr) = bind(&config).await?;
    let store = open_store(&config, &node_id).await?;
    let engine = open_engine(&config, store, &node_id, fleet(&config, addr)?).await?;
    let region = join_region(&config, &engine).await?;
    let definitions_seen = load_definitions(&config, &engine).await?;
    let front = open_front(&config, &engine, tls.as_ref())?;
    watch_definitions(&config, &engine, &front.state, definitions_seen);
    let rls = open_rls(&config, &front.state)?;
    let limits = conn_limits(&config, tls)?;
    let membership = join_fleet(&engine).await?;
    let others = bind_other_fronts(&config).await?;
    tracing::info!(%addr, node_id, store = %config.store_shown(), data_dir = %config.data_dir.display(), memory = config.memory, max_connections = limits.http.max_connections, "freqcap listening on {addr}");
    let sweeper = spawn_sweeper(&engine);
    run_until_stopped(&config, front, rls, limits, listener, others).await;
    leave_region(&engine, region).await;
    shut_down(&config, &engine, sweeper, membership).await
}

/// This node's name among a cluster's nodes (logs, metrics, leases): the
/// configured one, else `<hostname>:<listen port>`, which tells apart nodes
/// of one host.
fn node_id(config: &ServeConfig) -> String {
    config.node_id.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "localhost".into());
        format!("{host}:{}", config.listen.port())
    })
}

/// Opens where state is kept: a Redis Cluster (connecting off the executor,
/// as it waits on the network), memory, or RocksDB in `data_dir`.
async fn open_store(config: &ServeConfig, node_id: &str) -> Result<Arc<dyn Store>, String> {
    let store: Arc<dyn Store> = if crate::cluster::RedisOptions::is_url(&config.store) {
        let timeout = Duration::from_millis(config.redis_timeout_ms);
        let redis = connect_redis(config, &config.store, config.store_password()?, timeout).await?;
        tracing::info!(
            node_id,
            clustered = redis.clustered,
            "state in Redis ({})",
            config.store_shown()
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
    Ok(store)
}

/// Connects to the Redis of `url` with the store's CA and client
/// certificate (a global tier's too), off the executor: it waits on the
/// network.
async fn connect_redis(
    config: &ServeConfig,
    url: &str,
    password: Option<crate::cluster::Secret>,
    call_timeout: Duration,
) -> Result<crate::cluster::RedisStore, String> {
    let client = config
        .store_cert
        .as_deref()
        .zip(config.store_key.as_deref());
    let mut options = crate::cluster::RedisOptions::parse(url, config.durability)?.secure(
        password,
        config.store_ca.as_deref(),
        client,
    )?;
    options.call_timeout = call_timeout;
    tokio::task::spawn_blocking(move || crate::cluster::RedisStore::connect(options))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// The least deadline of a call to the global tier, ms.
const GLOBAL_TIMEOUT_MS: u64 = 2_000;

/// With `region` set: connects to the global tier and joins the region
/// (docs/regions.md), then renews the region's grants once a second on a
/// blocking thread of their own, so that no WAN call is ever made on a
/// decision's path.
async fn join_region(
    config: &ServeConfig,
    engine: &SharedEngine,
) -> Result<Option<RegionTicks>, String> {
    let (Some(name), Some(url)) = (&config.region, &config.global_store) else {
        return Ok(None);
    };
    let safe = config
        .region_safe
        .parse::<crate::engine::SafeCapacity>()
        .map_err(|e| format!("region_safe: {e}"))?;
    // The password, if any, is in the URL (or none): the store's own
    // password is the region's Redis's.
    // A WAN round trip is tens of ms where a region's Redis answers in
    // one: the tier's calls get 2 s (or redis_timeout_ms if longer), off
    // every decision's path.
    let timeout = Duration::from_millis(config.redis_timeout_ms.max(GLOBAL_TIMEOUT_MS));
    let global = connect_redis(config, url, None, timeout)
        .await
        .map_err(|e| format!("global_store: {e}"))?;
    engine
        .join_region(name, safe, Arc::new(global))
        .map_err(|e| e.to_string())?;
    tracing::info!(
        region = %name,
        global = %crate::cluster::RedisOptions::redact(url),
        "region {name}: leasing campaigns from the global tier"
    );
    let engine = engine.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        // A tick slower than a second (the tier timing out) is followed by
        // the next a second later, not by a burst of the missed ones.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Warned once per failing stretch, not every second.
        let mut failing = false;
        loop {
            tick.tick().await;
            if stopped.load(std::sync::atomic::Ordering::Acquire) {
                break;
            }
            let e = engine.clone();
            let r = tokio::task::spawn_blocking(move || e.region_tick()).await;
            match r {
                Ok(Err(err)) if !failing => {
                    failing = true;
                    tracing::warn!("region: the global tier did not answer: {err}");
                }
                Ok(Ok(())) if failing => {
                    failing = false;
                    tracing::info!("region: the global tier answers again");
                }
                _ => {}
            }
        }
    });
    Ok(Some((stop, task)))
}

/// Stops renewing the region's grants, once the tick under way (if any)
/// is done, and says how many calls this node made to the global tier:
/// every one of them by its region tick, so a count of the calls the WAN
/// carried can be held against it (benches/regions.sh does). The grants
/// stay with the region until they end (other nodes of it renew them).
async fn leave_region(engine: &SharedEngine, region: Option<RegionTicks>) {
    let Some((stop, task)) = region else {
        return;
    };
    stop.store(true, std::sync::atomic::Ordering::Release);
    // A tick waits at most the tier's call deadline per call (2 s), its
    // items renewed 32 at a time: 30 s bounds it unless the tier is cut
    // off with over a thousand items, when the count below may miss some.
    if tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .is_err()
    {
        tracing::warn!("region: the last renewal did not end within 30 s");
    }
    if let Some(f) = engine.region_figures() {
        tracing::info!(
            region = %f.name,
            calls = f.syncs + f.failures,
            failed = f.failures,
            "region {}: stopped renewing; {} lease calls made to the global tier, {} failed",
            f.name,
            f.syncs + f.failures,
            f.failures
        );
    }
}

/// Opens the engine on `store` with the configured limits, on a blocking
/// thread: opening reads the definitions, from disk or over the network.
async fn open_engine(
    config: &ServeConfig,
    store: Arc<dyn Store>,
    node_id: &str,
    fleet: Fleet,
) -> Result<SharedEngine, String> {
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
        node_id: node_id.to_owned(),
        spend_reports: config.spend_reports,
        record_layout: config.record_layout,
        fleet,
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
    Ok(Arc::new(engine))
}

/// Loads the definitions directory, if one is configured, before the first
/// request: a bad directory stops the start, as a bad config file does.
/// With a shared store only the definitions writer applies it; the others
/// check it. Returns what the watcher starts from: the directory's
/// fingerprint, and whether this node applied it.
async fn load_definitions(
    config: &ServeConfig,
    engine: &SharedEngine,
) -> Result<Option<(Option<u64>, bool)>, String> {
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
    Ok(definitions_seen)
}

/// What every front serves from: the shared state (engine, limits, tokens,
/// metrics), the HTTP router on it, and HTTP's connection counters (which
/// the metrics report and the HTTP server updates).
struct Front {
    state: Arc<AppState<SystemClock>>,
    app: axum::Router,
    connections: ConnCounters,
}

/// Builds the fronts' shared state from the configuration: one set of
/// limits and tokens, so a limit means the same whichever front a request
/// comes in by.
fn open_front(
    config: &ServeConfig,
    engine: &SharedEngine,
    tls: Option<&Arc<Tls>>,
) -> Result<Front, String> {
    let connections = ConnCounters::default();
    let peer_tls = match tls {
        None => None,
        Some(tls) if engine.advertised().is_some() => {
            let ca = config
                .tls_peer_ca
                .as_deref()
                .or(config.tls_client_ca.as_deref())
                .ok_or("tls_peer_ca: owner mode over TLS needs the CA of the other nodes' certificates")?;
            Some(crate::tls::peer_client(tls, ca)?)
        }
        Some(_) => None,
    };
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
            peer_tls,
            tls_counters: tls.map(|t| t.counters.clone()).unwrap_or_default(),
            header_style: config.header_style,
        },
    );
    let app = api::router_for(state.clone());
    Ok(Front {
        state,
        app,
        connections,
    })
}

/// Loads the listeners' TLS certificates, if configured, and starts
/// reloading them when they change or on SIGHUP.
fn open_tls(config: &ServeConfig) -> Result<Option<Arc<Tls>>, String> {
    let Some(files) = config.tls_files()? else {
        return Ok(None);
    };
    let tls = Arc::new(Tls::load(files, Default::default())?);
    tracing::info!(
        cert = %tls.files().cert.display(),
        mutual = tls.mutual(),
        "TLS on every listener{}",
        if tls.mutual() { ", client certificates required" } else { "" }
    );
    tokio::spawn(tls.clone().reload_when_changed());
    Ok(Some(tls))
}

/// Starts watching the definitions directory (SIGHUP, changes, taking over
/// as the definitions writer) from what [`load_definitions`] saw, counting
/// reloads in the metrics.
fn watch_definitions(
    config: &ServeConfig,
    engine: &SharedEngine,
    state: &AppState<SystemClock>,
    definitions_seen: Option<(Option<u64>, bool)>,
) {
    if let (Some(dir), Some((seen, writer))) = (&config.definitions, definitions_seen) {
        tokio::spawn(crate::definitions_dir::watch(
            engine.clone(),
            dir.clone(),
            state.metrics.definition_reloads.clone(),
            seen,
            writer,
        ));
    }
}

/// Loads Envoy's rate limit rules, if configured, and reloads them on
/// SIGHUP; they are served on the gRPC listener, so gRPC must be on.
fn open_rls(
    config: &ServeConfig,
    state: &AppState<SystemClock>,
) -> Result<Option<Arc<RulesHandle>>, String> {
    let rls = match &config.rls_config {
        None => None,
        Some(dir) => {
            if config.grpc_addr()?.is_none() {
                return Err(
                    "rls_config: Envoy's rate limit service is served on grpc_listen, which is off"
                        .into(),
                );
            }
            let handle = crate::rls::RulesHandle::open(
                dir,
                state.metrics.rls.clone(),
                config.rls_unknown_domain,
                config.rls_rule_metrics,
            )
            .map_err(|e| format!("rls_config: {e}"))?;
            let handle = Arc::new(handle);
            tracing::info!(dir = %dir.display(), rules = handle.current().count, "Envoy rate limit rules loaded from {}", dir.display());
            tokio::spawn(handle.clone().reload_on_sighup());
            Some(handle)
        }
    };
    Ok(rls)
}

/// Each listener's connection cap: HTTP's rules, and the RESP and gRPC caps
/// (0 when that front is off).
struct Limits {
    http: ConnLimits,
    resp_max: usize,
    grpc_max: usize,
}

/// The listeners' connection limits. Every front's connections take file
/// descriptors, so HTTP's cap is lowered until all of them fit the limit.
fn conn_limits(config: &ServeConfig, tls: Option<Arc<Tls>>) -> Result<Limits, String> {
    let secs = Duration::from_secs;
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
        tls,
    };
    Ok(Limits {
        http: limits,
        resp_max,
        grpc_max,
    })
}

/// Binds the HTTP listener, returning it with the address it got (port 0
/// picks a free one, which owner mode advertises).
async fn bind(config: &ServeConfig) -> Result<(TcpListener, SocketAddr), String> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    Ok((listener, addr))
}

/// How the fleet keeps its users' records (`reservations`): in owner mode,
/// with the address other nodes forward this node's users to (`addr`, the
/// HTTP listener's, when the configured port is 0).
fn fleet(config: &ServeConfig, addr: SocketAddr) -> Result<Fleet, String> {
    Ok(match config.advertised()? {
        None => Fleet::Shared,
        Some(at) => Fleet::Owner {
            advertise: if at.port() == 0 { addr } else { at }.to_string(),
        },
    })
}

/// Owner mode: joins the fleet before serving, and starts renewing the
/// membership lease. The node owns no user until its lease is active (a
/// lease after joining); meanwhile its requests go to the other members.
async fn join_fleet(engine: &SharedEngine) -> Result<Option<Membership>, String> {
    let Some(at) = engine.advertised().map(str::to_owned) else {
        return Ok(None);
    };
    let e = engine.clone();
    tokio::task::spawn_blocking(move || e.renew_membership())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("reservations: cannot join the fleet's members in Redis: {e}"))?;
    tracing::info!(%at, "owner mode: joined the fleet; forwarded requests reach this node at {at}");
    Ok(Some(membership_renewer(engine.clone())))
}

/// The RESP and gRPC listeners, each `None` when that front is off.
struct OtherListeners {
    resp: Option<TcpListener>,
    grpc: Option<TcpListener>,
}

/// Binds the RESP and gRPC listeners. Both are bound before [`serve`] logs
/// "freqcap listening", the line that tells scripts the service is up.
async fn bind_other_fronts(config: &ServeConfig) -> Result<OtherListeners, String> {
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
    Ok(OtherListeners {
        resp: resp_listener,
        grpc: grpc_listener,
    })
}

/// Starts the background ticks: reservations expire and idle records are
/// dropped even when no request comes, and definitions other nodes changed
/// are applied.
fn spawn_sweeper(engine: &SharedEngine) -> JoinHandle<()> {
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
}

/// Serves every front until SIGTERM or SIGINT, then returns once each has
/// drained (or its drain timeout passed). One signal stops every listener.
async fn run_until_stopped(
    config: &ServeConfig,
    front: Front,
    rls: Option<Arc<RulesHandle>>,
    limits: Limits,
    listener: TcpListener,
    others: OtherListeners,
) {
    let Front {
        state,
        app,
        connections,
    } = front;
    let Limits {
        http: limits,
        resp_max,
        grpc_max,
    } = limits;
    let secs = Duration::from_secs;
    let drain = limits.drain_timeout;
    // One signal stops every listener.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let resp = match others.resp {
        None => None,
        Some(l) => {
            let options = crate::resp::RespOptions {
                max_connections: resp_max,
                idle_timeout: secs(config.idle_timeout_secs),
                command_timeout: secs(config.header_timeout_secs),
                drain_timeout: drain,
                max_command: config.max_body,
                tls: limits.tls.clone(),
            };
            Some(tokio::spawn(crate::resp::serve(
                l,
                state.clone(),
                options,
                stopped(stop_rx.clone()),
            )))
        }
    };
    let grpc = others.grpc.map(|l| {
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
}

/// After the fronts drained: stops the background ticks, leaves the fleet
/// (owner mode), then hands over what this node holds, in this order: spend
/// is reported before the timelines' last batch and the writer's final
/// flush, so the fleet reads it at once.
async fn shut_down(
    config: &ServeConfig,
    engine: &SharedEngine,
    sweeper: JoinHandle<()>,
    membership: Option<Membership>,
) -> Result<(), String> {
    sweeper.abort();
    leave_fleet(engine, membership).await;
    tracing::info!("draining done; flushing the writer");
    // Off the runtime's threads: with a Redis store each of these calls
    // Redis through the store's own runtime, which blocks (on this thread
    // it panicked, and the last spend went unreported).
    let e = engine.clone();
    let definitions = config.definitions.is_some();
    tokio::task::spawn_blocking(move || {
        // Spend committed here and not reported yet: the fleet reads it at
        // once (docs/cluster.md, "Spend is reported").
        e.report_all_spend();
        // The campaigns' minutes (the ad-ops page) go with the last batch.
        e.flush_timelines(true);
        if definitions {
            // Another node takes the definitions directory over at once.
            e.release_definitions_writer();
        }
        e.flush()
    })
    .await
    .map_err(|e| format!("stopping: {e}"))?
    .map_err(|e| e.to_string())?;
    tracing::info!("stopped");
    Ok(())
}

/// Owner mode: stops renewing the membership lease and leaves the fleet, so
/// the other members take this node's users at once instead of when its
/// lease ends. A failure is logged, not returned: shutdown goes on.
async fn leave_fleet(engine: &SharedEngine, membership: Option<Membership>) {
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

/// Owner mode: renews this node's membership lease every
/// [`crate::cluster::owners::RENEW_EVERY`] on a thread of its own (a
/// renewal must not wait behind the sweeper's work), until told to stop.
fn membership_renewer(engine: SharedEngine) -> Membership {
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
