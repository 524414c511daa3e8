//! The connection to Redis (one, or a cluster) and its calls: deadlines,
//! retries, latency figures; what a failed call means (unreachable or a
//! fault); reading replies.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{Cmd, RedisError, RedisResult, Value};

use super::{FUNCTIONS, META, RedisOptions, time};
use crate::clock::Nanos;
use crate::store::shared::{CallStats, LATENCY_BOUNDS_US};
use crate::store::{Cas, Durability, Op, Space, StoreError};

/// A connection to a cluster, or to one Redis (development).
#[derive(Clone)]
pub(super) enum Conn {
    Cluster(redis::cluster_async::ClusterConnection),
    Single(redis::aio::MultiplexedConnection),
}

impl Conn {
    pub(super) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// A write followed by `WAIT 1 <ms>` on the same primary (one slot, so
    /// one pipeline): the write's reply and how many replicas have it.
    pub(super) async fn query_and_wait(
        &self,
        cmd: &Cmd,
        wait_ms: u64,
    ) -> RedisResult<(Value, i64)> {
        let mut p = redis::pipe();
        p.add_command(cmd.clone()).cmd("WAIT").arg(1).arg(wait_ms);
        let (v, n): (Value, i64) = match self {
            Conn::Cluster(c) => p.query_async(&mut c.clone()).await?,
            Conn::Single(c) => p.query_async(&mut c.clone()).await?,
        };
        Ok((v, n))
    }

    /// `cmd` on every primary.
    pub(super) async fn on_primaries(&self, cmd: Cmd) -> RedisResult<Value> {
        match self {
            Conn::Cluster(c) => {
                let route = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                ));
                c.clone().route_command(cmd, route).await
            }
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
        }
    }
}

/// See the module documentation.
pub struct RedisStore {
    /// The client's own runtime: the engine calls from blocking threads
    /// and waits here, so a slow shard never parks the server's executor.
    /// An `Option` only so that [`Drop`] can shut it down without blocking.
    pub(super) rt: Option<tokio::runtime::Runtime>,
    /// `rt`'s handle, which calls run on.
    pub(super) handle: tokio::runtime::Handle,
    pub(super) conn: Conn,
    pub(super) options: RedisOptions,
    pub stats: CallStats,
    /// Whether the seeds are a cluster (else one Redis).
    pub clustered: bool,
    /// Redis's time as this node measures it: the time it decides at.
    pub clock: Arc<time::ClusterClock>,
}

impl Drop for RedisStore {
    /// A runtime dropped on an async thread panics ("Cannot drop a runtime
    /// in a context where blocking is not allowed"): a start-up error after
    /// connecting (a bad `rls_config`, say) returns through the server's
    /// runtime and dropped the store there, so the process panicked instead
    /// of saying what was wrong. Shut down in the background instead.
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// How long a node starting waits for Redis to answer before it gives up:
/// a failover takes `cluster-node-timeout` + 1–2 s (4 s with ops/
/// redis-cluster.sh's 2 s), so a node started during one serves once it is
/// over instead of exiting.
pub const START_WAIT: Duration = Duration::from_secs(30);

/// Pause between tries at start.
pub const START_RETRY: Duration = Duration::from_millis(500);

impl RedisStore {
    /// Connects to the seeds and loads the Functions library on every
    /// primary, trying again for up to [`START_WAIT`] while Redis cannot
    /// answer.
    pub fn connect(options: RedisOptions) -> Result<Self, StoreError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("freqcap-redis")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Os {
                context: "starting the Redis client's runtime".into(),
                source: e.into(),
            })?;
        let started = Instant::now();
        for attempt in 0u32.. {
            let tried = rt
                .block_on(connect(&options))
                .and_then(|(conn, clustered)| {
                    let store = RedisStore {
                        handle: rt.handle().clone(),
                        // Given the runtime once it is whole: a failed attempt
                        // is dropped without stopping it.
                        rt: None,
                        conn,
                        options: options.clone(),
                        stats: CallStats::default(),
                        clustered,
                        clock: Arc::default(),
                    };
                    store.load_functions()?;
                    Ok(store)
                });
            match tried {
                Ok(mut store) => {
                    if started.elapsed() > START_RETRY {
                        tracing::info!(
                            "Redis answers after {:.1} s: serving",
                            started.elapsed().as_secs_f64()
                        );
                    }
                    store.rt = Some(rt);
                    store.start_clock();
                    return Ok(store);
                }
                // A primary down or failing over, replicas still syncing:
                // the node serves as soon as Redis does, within START_WAIT.
                Err(StoreError::Unavailable(why)) if started.elapsed() < START_WAIT => {
                    // Once, then every 5 s: a wrong address is not 60 lines.
                    if attempt.is_multiple_of(10) {
                        tracing::warn!(
                            "waiting for Redis ({why}); trying again every {} ms for up to {} s",
                            START_RETRY.as_millis(),
                            START_WAIT.as_secs()
                        );
                    }
                    std::thread::sleep(START_RETRY);
                }
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Unavailable("Redis did not answer".into()))
    }

    /// Measures Redis's time before the node decides anything, then every
    /// [`time::INTERVAL`] on the client's runtime (not on a decision's path:
    /// one `TIME` a second per node). A failed measure keeps the last offset;
    /// the next one retries.
    pub(super) fn start_clock(&self) {
        let sample = |conn: Conn, clock: Arc<time::ClusterClock>| async move {
            time::measure(&clock, || async { conn.query(&redis::cmd("TIME")).await }).await
        };
        match self.run("TIME", sample(self.conn.clone(), self.clock.clone())) {
            Ok(Some(offset)) => tracing::info!(
                "clock: Redis's time is this node's {:+.6} s (decisions use Redis's)",
                offset as f64 / 1e9
            ),
            Ok(None) => tracing::warn!(
                "clock: Redis's TIME reply was not a time; decisions use this node's clock until it is"
            ),
            Err(e) => tracing::warn!(
                "clock: Redis's TIME could not be read ({e}); decisions use this node's clock until it is"
            ),
        }
        let (conn, clock, deadline) = (
            self.conn.clone(),
            self.clock.clone(),
            self.options.call_timeout,
        );
        self.handle.spawn(async move {
            let mut every = tokio::time::interval(time::INTERVAL);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            every.tick().await;
            loop {
                every.tick().await;
                let r = tokio::time::timeout(deadline, sample(conn.clone(), clock.clone())).await;
                if let Ok(Err(e)) = r {
                    tracing::debug!("clock: TIME failed: {e}");
                }
            }
        });
    }

    /// `FUNCTION LOAD REPLACE` on every primary (functions replicate and
    /// survive failover; a primary added later gets it at the first call
    /// that finds it missing).
    pub fn load_functions(&self) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg("REPLACE").arg(FUNCTIONS);
        let conn = self.conn.clone();
        // Loading may take longer than a decision's call.
        let t = self.options.call_timeout.max(Duration::from_secs(5));
        self.run_for(
            "FUNCTION LOAD",
            t,
            async move { conn.on_primaries(cmd).await },
        )
        .map(drop)
    }

    pub(super) fn run<T>(
        &self,
        what: &str,
        fut: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, StoreError> {
        self.run_for(what, self.options.call_timeout, fut)
    }

    /// Runs one call with a deadline, counting it.
    pub(super) fn run_for<T>(
        &self,
        what: &str,
        deadline: Duration,
        fut: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let span = tracing::info_span!(
            target: crate::front::trace::TARGET,
            "store.call",
            otel.kind = "client",
            db.system = "redis",
            call = what,
        );
        let _in_span = span.enter();
        let started = Instant::now();
        let r = self
            .handle
            .block_on(async { tokio::time::timeout(deadline, fut).await });
        let us = started.elapsed().as_micros() as u64;
        // The round trip as an event of the call's span.
        tracing::info!(
            target: crate::front::trace::TARGET,
            latency_us = us,
            ok = matches!(r, Ok(Ok(_))),
            "round trip"
        );
        let s = &self.stats;
        s.calls.fetch_add(1, Ordering::Relaxed);
        s.latency_us.fetch_add(us, Ordering::Relaxed);
        let b = LATENCY_BOUNDS_US
            .iter()
            .position(|&x| us <= x)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        s.latency_buckets[b].fetch_add(1, Ordering::Relaxed);
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                s.errors.fetch_add(1, Ordering::Relaxed);
                Err(classify(what, e))
            }
            Err(_) => {
                s.timeouts.fetch_add(1, Ordering::Relaxed);
                Err(StoreError::Unavailable(format!(
                    "{what}: no answer within {} ms",
                    deadline.as_millis()
                )))
            }
        }
    }

    /// An `FCALL`, loading the library first if the primary lacks it (a
    /// primary added after this node started).
    pub(super) fn fcall(&self, cmd: &Cmd, wait: bool) -> Result<(Value, i64), StoreError> {
        let once = || {
            let conn = self.conn.clone();
            let cmd = cmd.clone();
            let wait_ms = (self.options.call_timeout.as_millis() as u64 / 2).max(1);
            self.run("FCALL", async move {
                if wait {
                    conn.query_and_wait(&cmd, wait_ms).await
                } else {
                    Ok((conn.query(&cmd).await?, 1))
                }
            })
        };
        match once() {
            Err(StoreError::Io(m)) if m.contains("Function not found") => {
                self.load_functions()?;
                once()
            }
            r => r,
        }
    }

    /// Runs a compare-and-set function (`fc_cas_v1`, `fc_cas_v2`) and reads
    /// its answer.
    pub(super) fn cas_call(&self, what: &str, c: &Cmd) -> Result<Cas, StoreError> {
        let (v, replicas) = self.fcall(c, self.waits())?;
        let Value::Array(a) = &v else {
            return Err(unexpected(what, &v));
        };
        match a.as_slice() {
            [ok, ver] if int(ok) == Some(1) => {
                let ver = int(ver).ok_or_else(|| unexpected(what, &v))?;
                if replicas < 1 {
                    // Applied on the primary, not confirmed on a replica: not
                    // acknowledged. The engine reads the record again.
                    self.stats.unreplicated.fetch_add(1, Ordering::Relaxed);
                    return Err(StoreError::Unavailable(
                        "the write was not confirmed by a replica in time (durability replicated)"
                            .into(),
                    ));
                }
                Ok(Cas::Written(ver))
            }
            [Value::Int(-1), e] => Ok(Cas::Fenced(int(e).ok_or_else(|| unexpected(what, &v))?)),
            [Value::Int(-2), since, b] => Ok(Cas::Leased {
                since_ms: int(since).ok_or_else(|| unexpected(what, &v))?,
                value: bytes(b),
            }),
            [ok, ver, b] if int(ok) == Some(0) => Ok(Cas::Conflict {
                version: int(ver).ok_or_else(|| unexpected(what, &v))?,
                value: bytes(b),
            }),
            _ => Err(unexpected(what, &v)),
        }
    }

    pub(super) fn query(&self, what: &str, cmd: Cmd) -> Result<Value, StoreError> {
        let conn = self.conn.clone();
        self.run(what, async move { conn.query(&cmd).await })
    }

    /// Whether writes wait for a replica.
    pub(super) fn waits(&self) -> bool {
        matches!(
            self.options.durability,
            Durability::Replicated | Durability::Fsync
        )
    }

    pub(super) fn apply(&self, op: Op) -> Result<(), StoreError> {
        match op {
            // Meta is set once: the first node's secret stays.
            Op::Put(Space::Meta, k, v) => {
                let mut c = redis::cmd("HSETNX");
                c.arg(META).arg(k).arg(v);
                self.query("HSETNX meta", c).map(drop)
            }
            // Definitions go through `write_definitions`, records through
            // `cas`, event ids through `claim`; campaign records hold
            // nothing with this store (docs/cluster.md).
            Op::Put(..) | Op::Delete(..) => Ok(()),
        }
    }

    /// Groups of commands, each group's on one slot, and every reply by
    /// group. One Redis takes them all in one pipeline; a cluster client
    /// pipelines one slot's commands only, so there each group is a
    /// pipeline of its own, all sent at once: one round trip either way.
    pub(super) fn pipes(
        &self,
        what: &str,
        groups: Vec<Vec<Cmd>>,
    ) -> Result<Vec<Vec<Value>>, StoreError> {
        let conn = self.conn.clone();
        self.run(what, async move {
            let lens: Vec<usize> = groups.iter().map(Vec::len).collect();
            let mut out = Vec::with_capacity(groups.len());
            match &conn {
                Conn::Single(c) => {
                    let mut p = redis::pipe();
                    for cmd in groups.into_iter().flatten() {
                        p.add_command(cmd);
                    }
                    let replies: Vec<Value> = p.query_async(&mut c.clone()).await?;
                    let mut replies = replies.into_iter();
                    for n in lens {
                        out.push(replies.by_ref().take(n).collect());
                    }
                }
                Conn::Cluster(c) => {
                    let mut tasks = tokio::task::JoinSet::new();
                    for (i, group) in groups.into_iter().enumerate() {
                        let mut c = c.clone();
                        tasks.spawn(async move {
                            let mut p = redis::pipe();
                            for cmd in group {
                                p.add_command(cmd);
                            }
                            (i, p.query_async::<Vec<Value>>(&mut c).await)
                        });
                    }
                    out.resize(lens.len(), Vec::new());
                    // Dropped at the call's deadline: the rest are aborted.
                    while let Some(done) = tasks.join_next().await {
                        let (i, v) =
                            done.map_err(|e| RedisError::from(std::io::Error::other(e)))?;
                        out[i] = v?;
                    }
                }
            }
            Ok(out)
        })
    }

    /// A pipeline of commands on one slot; its replies.
    pub(super) fn pipe(&self, what: &str, p: redis::Pipeline) -> Result<Value, StoreError> {
        let conn = self.conn.clone();
        self.run(what, async move {
            match &conn {
                Conn::Cluster(c) => p.query_async::<Value>(&mut c.clone()).await,
                Conn::Single(c) => p.query_async::<Value>(&mut c.clone()).await,
            }
        })
    }
}

pub(super) async fn connect(o: &RedisOptions) -> Result<(Conn, bool), StoreError> {
    // Errors name the seeds, never the URL: it may hold the password.
    // Refused credentials are final (waiting START_WAIT would not change
    // them); anything else may be Redis starting or failing over.
    let unavailable = |e: RedisError| {
        let seeds = o.seeds.join(",");
        if refused_credentials(&e) {
            StoreError::Io(format!(
                "Redis at {seeds} refused this node's credentials ({e}): check the store's user \
                 and password (the URL, store_password_file or FREQCAP_STORE_PASSWORD) and the \
                 user's ACL rules"
            ))
        } else {
            StoreError::Unavailable(format!("cannot reach Redis at {seeds}: {e}"))
        }
    };
    // One Redis or a cluster: the first seed that answers says (a seed may
    // be a primary that just died).
    let mut probed = Err(StoreError::Unavailable("no seed".into()));
    for seed in &o.seeds {
        let first = o.seed_url(seed);
        let probe = single_client(o, &first).map_err(unavailable)?;
        probed = match tokio::time::timeout(
            Duration::from_secs(2),
            probe.get_multiplexed_async_connection(),
        )
        .await
        {
            Ok(Ok(c)) => Ok((first, c)),
            Ok(Err(e)) => Err(unavailable(e)),
            Err(_) => Err(StoreError::Unavailable(format!(
                "Redis at {first} did not answer within 2 s"
            ))),
        };
        if probed.is_ok() {
            break;
        }
    }
    let (first, mut single) = probed?;
    let info: String = redis::cmd("INFO")
        .arg("cluster")
        .query_async(&mut single)
        .await
        .map_err(unavailable)?;
    let clustered = info.contains("cluster_enabled:1");
    if o.single {
        if clustered {
            return Err(StoreError::Unavailable(format!(
                "{first} is a cluster node: use {}-cluster:// for a cluster",
                if o.tls { "rediss" } else { "redis" }
            )));
        }
        return Ok((Conn::Single(single), false));
    }
    if !clustered {
        tracing::warn!(
            "{first} is a single Redis, not a cluster: fine for development, \
             but it is one point of failure (redis:// names one Redis)"
        );
        return Ok((Conn::Single(single), false));
    }
    let mut builder = redis::cluster::ClusterClient::builder(o.seeds.iter().map(|s| o.seed_url(s)))
        // One retry, no sleeps in between (min/max wait in ms): a dead shard
        // fails its requests within the call's deadline instead of stalling.
        .retries(1)
        .min_retry_wait(1)
        .max_retry_wait(10)
        .connection_timeout(Duration::from_millis(250))
        .response_timeout(o.call_timeout);
    if let Some(user) = &o.username {
        builder = builder.username(user);
    }
    if let Some(p) = &o.password {
        builder = builder.password(&p.0);
    }
    if o.tls {
        builder = builder.tls(redis::TlsMode::Secure);
        if let Some(certs) = &o.certs {
            builder = builder.certs(certs.clone());
        }
    }
    let client = builder.build().map_err(unavailable)?;
    let conn = tokio::time::timeout(Duration::from_secs(5), client.get_async_connection())
        .await
        .map_err(|_| StoreError::Unavailable("the cluster did not answer within 5 s".into()))?
        .map_err(unavailable)?;
    Ok((Conn::Cluster(conn), true))
}

/// Whether Redis refused the user or password, or the user lacks a right.
fn refused_credentials(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
}

/// A client of the one Redis at `url` (no credentials in it), with the
/// configured user, password and certificates.
fn single_client(o: &RedisOptions, url: &str) -> RedisResult<redis::Client> {
    use redis::IntoConnectionInfo;
    let info = url.into_connection_info()?;
    let mut settings = info.redis_settings().clone();
    if let Some(user) = &o.username {
        settings = settings.set_username(user);
    }
    if let Some(p) = &o.password {
        settings = settings.set_password(&p.0);
    }
    let info = info.set_redis_settings(settings);
    match &o.certs {
        Some(certs) if o.tls => redis::Client::build_with_tls(info, certs.clone()),
        _ => redis::Client::open(info),
    }
}

/// A failed call: unreachable (the caller may retry later) or a fault.
pub(super) fn classify(what: &str, e: RedisError) -> StoreError {
    use redis::ErrorKind;
    let down = e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_cluster_error()
        || matches!(e.kind(), ErrorKind::Server(_) if {
            let m = e.to_string();
            m.contains("CLUSTERDOWN") || m.contains("TRYAGAIN") || m.contains("MASTERDOWN")
                || m.contains("LOADING") || m.contains("READONLY")
        });
    if down {
        StoreError::Unavailable(format!("{what}: {e}"))
    } else {
        StoreError::Io(format!("{what}: {e}"))
    }
}

/// A record's Redis key from its store key (`u` or `k` + 16 bytes, or an
/// event id's `e` + 16 bytes).
pub(super) fn redis_key(disk: &[u8]) -> String {
    let (kind, rest) = disk.split_first().map_or((b'?', &[][..]), |(k, r)| (*k, r));
    let mut s = String::with_capacity(8 + 2 * rest.len());
    s.push_str("fc:{");
    s.push(kind as char);
    s.push(':');
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in rest {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 15)]));
    }
    s.push('}');
    s
}

pub(super) fn ms(t: Nanos) -> u64 {
    t.div_ceil(1_000_000)
}

pub(super) fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

pub(super) fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        _ => None,
    }
}

/// A hash's field-value pairs: RESP2 answers a flat array, RESP3 a map.
pub(super) fn pairs(v: &Value) -> Option<Vec<(&Value, &Value)>> {
    match v {
        Value::Array(flat) => Some(
            flat.chunks(2)
                .filter_map(|p| match p {
                    [f, n] => Some((f, n)),
                    _ => None,
                })
                .collect(),
        ),
        Value::Map(m) => Some(m.iter().map(|(f, n)| (f, n)).collect()),
        _ => None,
    }
}

pub(super) fn unexpected(what: &str, v: &Value) -> StoreError {
    StoreError::Io(format!("{what}: unexpected reply {v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn keys_put_one_record_in_one_slot() {
        let mut k = vec![b'u'];
        k.extend_from_slice(&[0xab; 16]);
        assert_eq!(redis_key(&k), format!("fc:{{u:{}}}", "ab".repeat(16)));
    }
}
