//! The HTTP listener of `freqcap serve`: how connections are accepted, timed
//! out and closed. The router (`src/api/`) decides what a request gets; this
//! file decides which connections may send requests at all.
//!
//! - **A cap on open connections**, below the process's file-descriptor
//!   limit. Past `max_connections`, up to `probe_connections` more are
//!   accepted but serve only the public routes (`/healthz`, `/readyz`,
//!   `/metrics`, `/openapi.json`) with short timeouts, so a probe still gets
//!   through while a client holds every ordinary slot; past both, a new
//!   connection is closed at once (the file-descriptor limit is never reached).
//! - **Timeouts.** A connection must send a complete request head within
//!   `header_timeout` of its first byte, and may stay idle between requests
//!   for `idle_timeout`; the body's deadline is the router's (`body_timeout`,
//!   `src/api/guard.rs`). Before these, 10 000 idle connections held ~355 MB
//!   for ever.
//! - **Queueing delay.** Each connection's task measures how long it waited
//!   in the runtime's queue between being woken (its socket became readable)
//!   and being run: [`Conn::queue_delay`]. Under CPU saturation that wait is
//!   where latency goes, and it is what the router sheds on.
//! - **Shutdown** stops accepting, asks every connection to finish its
//!   request in progress and close, waits `drain_timeout` at most, then closes
//!   what is left, so a half-sent request cannot hold the process.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::tls::Stream;

/// Limits on connections (`docs/service.md`, "Connections").
#[derive(Debug, Clone)]
pub struct ConnLimits {
    /// From the first byte of a request to the end of its head.
    pub header_timeout: Duration,
    /// Between requests on a kept-alive connection (and before the first).
    pub idle_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections accepted past `max_connections` for probes and scrapes.
    pub probe_connections: usize,
    /// How long shutdown waits for requests in progress.
    pub drain_timeout: Duration,
    /// How long a new connection may go without sending a request; `None`:
    /// `idle_timeout` (the HTTP port). gRPC's is `header_timeout`, so that
    /// silent sockets cannot hold every place for long.
    pub first_request_timeout: Option<Duration>,
    /// Serve HTTP/2 only (the gRPC listener); else HTTP/1.1, or HTTP/2 when a
    /// connection opens with its preface.
    pub http2_only: bool,
    /// TLS on this listener (`src/tls/`): every connection's handshake,
    /// within `header_timeout`, comes before its first request.
    pub tls: Option<Arc<crate::tls::Tls>>,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            probe_connections: 64,
            drain_timeout: Duration::from_secs(10),
            first_request_timeout: None,
            http2_only: false,
            tls: None,
        }
    }
}

/// HTTP/2 streams (requests) at once on one connection.
const H2_MAX_STREAMS: u32 = 256;
/// HTTP/2 header list of one request, bytes.
const H2_MAX_HEADER_LIST: u32 = 64 * 1024;

/// HTTP/1's read buffer, bytes: a request head must fit (past it, 431).
/// hyper's default (~400 KiB) let 100 connections trickling a head hold
/// 67.6 MB (676 KB each) until the header timeout; the same 64 KiB as
/// HTTP/2's header list keeps a connection's share small.
const H1_MAX_BUF: usize = 64 * 1024;

/// HTTP/2 flow-control windows, bytes: what a peer may send before the
/// server reads it, per stream and per connection (hyper's defaults are
/// 1 MiB each). Bodies are read at once into the body memory budget, so the
/// windows bound only what is in transit; 256 KiB per connection keeps that
/// term of the memory formula small (docs/service.md, "Memory") and still
/// moves a 1 MiB body on loopback in a few round trips.
const H2_STREAM_WINDOW: u32 = 64 * 1024;
const H2_CONN_WINDOW: u32 = 256 * 1024;

/// HTTP/2 pings: every 30 s of silence, and a peer that does not answer
/// within 10 s is gone (its connection closed).
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// Timeouts of a connection over the cap, kept only for probes: a client
/// that fills them too is closed within this time.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// File descriptors kept out of the connection cap: RocksDB's files, the log,
/// the listener, and new connections accepted only to be closed.
pub const FD_RESERVE: usize = 1024;

/// The connection cap the process can honour: `wanted`, lowered so that
/// connections and [`FD_RESERVE`] fit within the file-descriptor limit (whose
/// soft value is first raised to the hard one).
pub fn fit_to_fd_limit(wanted: usize, probes: usize) -> usize {
    let Some(limit) = raise_fd_limit() else {
        return wanted;
    };
    let room = limit.saturating_sub(FD_RESERVE + probes);
    if room < wanted {
        tracing::warn!(
            wanted,
            fd_limit = limit,
            "max_connections lowered to {room} to stay below the file-descriptor limit"
        );
    }
    wanted.min(room).max(1)
}

/// Raises the soft limit on open files to the hard one; the limit now in force.
fn raise_fd_limit() -> Option<usize> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return None;
    }
    if r.rlim_cur < r.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            r.rlim_cur = r.rlim_max;
        }
    }
    usize::try_from(r.rlim_cur).ok()
}

/// Monotonic nanoseconds since the first call, plus one, so that 0 can mean
/// "not set" in the atomics below.
fn mono_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_nanos())
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}

/// What a request knows of its connection (a request extension). Absent for
/// requests that did not come through a socket (replay, tests in-process).
#[derive(Clone)]
pub struct Conn(Arc<ConnState>);

impl Conn {
    /// How long this connection's task waited to run after it was woken, at
    /// the poll that is handling the request: the request's queueing delay.
    pub fn queue_delay(&self) -> Duration {
        Duration::from_nanos(self.0.delay.load(Ordering::Relaxed))
    }

    /// Whether this connection was accepted over the cap: it serves only
    /// public routes.
    pub fn probe_only(&self) -> bool {
        self.0.probe_only
    }
}

struct ConnState {
    probe_only: bool,
    /// HTTP/1 or HTTP/2, once the first bytes tell ([`PROTO_UNKNOWN`]...).
    proto: AtomicU8,
    /// Whether a request has come (the first-request timeout no longer runs).
    served: AtomicBool,
    /// When the task was woken and not yet run (0: not woken since its last poll).
    woken_at: AtomicU64,
    /// The wait measured at the current poll, ns.
    delay: AtomicU64,
    /// The task's own waker, which [`Probe`] wakes after noting the time.
    waker: Mutex<Option<Waker>>,
    /// Requests being handled.
    busy: AtomicU32,
    /// When the first byte of a request head arrived (0: none pending).
    head_started: AtomicU64,
    /// When the connection last became idle (opened or answered a request).
    idle_since: AtomicU64,
}

const PROTO_UNKNOWN: u8 = 0;
const PROTO_HTTP1: u8 = 1;
const PROTO_HTTP2: u8 = 2;

impl ConnState {
    fn new(probe_only: bool, http2_only: bool) -> Self {
        ConnState {
            probe_only,
            proto: AtomicU8::new(if http2_only {
                PROTO_HTTP2
            } else {
                PROTO_UNKNOWN
            }),
            served: AtomicBool::new(false),
            woken_at: AtomicU64::new(0),
            delay: AtomicU64::new(0),
            waker: Mutex::new(None),
            busy: AtomicU32::new(0),
            head_started: AtomicU64::new(0),
            idle_since: AtomicU64::new(mono_ns()),
        }
    }
}

/// The waker the connection's future is polled with: notes when it is woken,
/// then wakes the task.
struct Probe(Arc<ConnState>);

impl Wake for Probe {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let _ =
            self.0
                .woken_at
                .compare_exchange(0, mono_ns(), Ordering::Relaxed, Ordering::Relaxed);
        if let Ok(w) = self.0.waker.lock()
            && let Some(w) = w.as_ref()
        {
            w.wake_by_ref();
        }
    }
}

/// A connection's future, measuring its queueing delay at every poll.
struct Measured<F> {
    inner: Pin<Box<F>>,
    state: Arc<ConnState>,
    waker: Waker,
}

impl<F: Future> Future for Measured<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let woken = this.state.woken_at.swap(0, Ordering::Relaxed);
        let delay = if woken == 0 {
            0
        } else {
            mono_ns().saturating_sub(woken)
        };
        this.state.delay.store(delay, Ordering::Relaxed);
        if let Ok(mut w) = this.state.waker.lock()
            && !w.as_ref().is_some_and(|w| w.will_wake(cx.waker()))
        {
            *w = Some(cx.waker().clone());
        }
        this.inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

/// Figures of a listener, registered in the metrics (`src/front/metrics.rs`):
/// clones count into the same series. The listener owns them, so it needs
/// nothing of the layers above it.
#[derive(Debug, Clone, Default)]
pub struct ConnCounters {
    /// Connections open now.
    pub open: Gauge,
    /// Connections closed at accept: over `max_connections` and the probe reserve.
    pub refused: Counter,
    /// Connections closed for being idle, or slow to send a request head.
    pub timed_out: Counter,
}

/// The socket, noting when a request head starts arriving on an idle
/// HTTP/1 connection (the header timeout runs from there). An HTTP/2
/// connection's bytes are not heads: pings, window updates and settings
/// come and go while it is idle, so its streams, not its bytes, say whether
/// it is in use.
///
/// On HTTP/2 it also gathers what h2 writes between two flushes into one
/// `writev` ([`Coalesced`]).
struct Tracked {
    io: Stream,
    state: Arc<ConnState>,
    out: Coalesced,
}

/// Most bytes an HTTP/2 connection gathers before writing them (allocated
/// on its first write, kept while it lives).
const COALESCE_MAX: usize = 8 * 1024;

/// What h2 wrote since its last flush, written at the flush in one call.
///
/// An HTTP/2 answer is its HEADERS, DATA and trailers. With vectored writes
/// h2 chains a DATA payload over 256 bytes and writes it before it buffers
/// the next frame: an Envoy `ShouldRateLimit` answer with its `RateLimit`
/// fields (~280 bytes) went out in two calls, and cost its client two
/// wake-ups (strace over a run: 29 383 `writev` for 14 995 `recvfrom`).
/// Reported unvectored ([`Tracked::is_write_vectored`]), h2 copies payloads
/// of up to 1 KiB into its buffer: one `sendto` per answer. Throughput moved
/// within the noise on a quiet machine (ShouldRateLimit 0.99× on a hot key,
/// 1.10× on 1 M keys, Screen + Commit 1.11×, two alternating runs each) and
/// +21 % to +27 % ShouldRateLimit while a build shared the machine, where a
/// system call and a wake-up cost more. Past 1 KiB (a
/// 50-candidate Screen answer is ~1.6 KiB) h2 writes its buffer, then the
/// payload, then the trailers at its next flush; gathered here, the first
/// two are one call. HTTP/1 is left alone: hyper writes a response in one
/// call already.
#[derive(Default)]
struct Coalesced {
    buf: Vec<u8>,
    /// How much of `buf` is written.
    sent: usize,
}

impl Coalesced {
    /// Writes what is gathered; Ready(Ok) once all of it is out.
    fn poll_drain(&mut self, io: &mut Stream, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.sent < self.buf.len() {
            match Pin::new(&mut *io).poll_write(cx, &self.buf[self.sent..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => self.sent += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.buf.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Gathers `bufs` when they fit, else drains and then gathers them or,
    /// past [`COALESCE_MAX`], writes them straight.
    fn poll_write(
        &mut self,
        io: &mut Stream,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if self.buf.len() + len > COALESCE_MAX {
            if let Err(e) = std::task::ready!(self.poll_drain(io, cx)) {
                return Poll::Ready(Err(e));
            }
            if len > COALESCE_MAX {
                return Pin::new(io).poll_write_vectored(cx, bufs);
            }
        }
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(COALESCE_MAX);
        }
        for b in bufs {
            self.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(len))
    }
}

impl Tracked {
    fn http2(&self) -> bool {
        self.state.proto.load(Ordering::Relaxed) == PROTO_HTTP2
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        let got = &buf.filled()[before..];
        if got.is_empty() {
            return r;
        }
        let mut proto = this.state.proto.load(Ordering::Relaxed);
        if proto == PROTO_UNKNOWN {
            // HTTP/2's preface opens "PRI * HTTP/2.0"; no HTTP/1 method
            // starts "PR".
            proto = if got.starts_with(b"PR") {
                PROTO_HTTP2
            } else {
                PROTO_HTTP1
            };
            this.state.proto.store(proto, Ordering::Relaxed);
        }
        if proto == PROTO_HTTP1
            && this.state.busy.load(Ordering::Relaxed) == 0
            && this.state.head_started.load(Ordering::Relaxed) == 0
        {
            this.state.head_started.store(mono_ns(), Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.http2() {
            return this
                .out
                .poll_write(&mut this.io, cx, &[std::io::IoSlice::new(buf)]);
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = std::task::ready!(this.out.poll_drain(&mut this.io, cx)) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = std::task::ready!(this.out.poll_drain(&mut this.io, cx)) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.http2() {
            return this.out.poll_write(&mut this.io, cx, bufs);
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    /// Not on HTTP/2 (nor before the first read, which an HTTP/2-only
    /// listener's h2 asks at once): h2 then copies DATA payloads of up to
    /// 1 KiB into its buffer with the frames around them, where with
    /// vectored writes it chains those over 256 bytes and writes them before
    /// it buffers the next frame (its `CHAIN_THRESHOLD`s).
    fn is_write_vectored(&self) -> bool {
        self.state.proto.load(Ordering::Relaxed) == PROTO_HTTP1 && self.io.is_write_vectored()
    }
}

/// Marks a request as being handled while it lives.
struct Busy(Arc<ConnState>);

impl Busy {
    fn new(state: &Arc<ConnState>) -> Self {
        state.busy.fetch_add(1, Ordering::Relaxed);
        state.served.store(true, Ordering::Relaxed);
        state.head_started.store(0, Ordering::Relaxed);
        Busy(state.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.idle_since.store(mono_ns(), Ordering::Relaxed);
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Resolves when the connection has been idle, or slow to send a request
/// head, past its timeout. A connection that never sent a request has
/// `first` from its opening: gRPC's silent sockets, which got the server's
/// SETTINGS and were never closed, held every place of the listener and
/// SIGTERM for as long as their peer liked (security probe, cases
/// 1.27–1.29).
async fn watchdog(state: Arc<ConnState>, header: Duration, idle: Duration, first: Duration) {
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    loop {
        let now = mono_ns();
        let idle_for = if state.served.load(Ordering::Relaxed) {
            idle
        } else {
            first
        };
        let deadline = if state.busy.load(Ordering::Relaxed) > 0 {
            // Handling a request: its body has the router's deadline; look
            // again once an idle period could have passed.
            now.saturating_add(ns(idle))
        } else {
            match state.head_started.load(Ordering::Relaxed) {
                0 => state
                    .idle_since
                    .load(Ordering::Relaxed)
                    .saturating_add(ns(idle_for)),
                started => started.saturating_add(ns(header)),
            }
        };
        if deadline <= now {
            return;
        }
        tokio::time::sleep(Duration::from_nanos(deadline - now)).await;
    }
}

/// `make(conn)`'s future, measuring its queueing delay at every poll as an
/// HTTP connection's is: [`Conn::queue_delay`] is what load shedding
/// compares. The RESP front runs its connections in it.
pub fn measured<F: Future>(make: impl FnOnce(Conn) -> F) -> impl Future<Output = F::Output> {
    let state = Arc::new(ConnState::new(false, false));
    let waker = Waker::from(Arc::new(Probe(state.clone())));
    let inner = Box::pin(make(Conn(state.clone())));
    Measured {
        inner,
        state,
        waker,
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then drains.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    counters: ConnCounters,
    shutdown: impl Future<Output = ()>,
) {
    let capacity = limits.max_connections + limits.probe_connections;
    let drain_timeout = limits.drain_timeout;
    let conn_counters = counters.clone();
    listen(
        listener,
        &counters,
        capacity,
        drain_timeout,
        shutdown,
        move |stream, open, stop| {
            // Past max_connections, a connection is kept for probes only.
            let state = Arc::new(ConnState::new(
                open >= limits.max_connections,
                limits.http2_only,
            ));
            let waker = Waker::from(Arc::new(Probe(state.clone())));
            let conn = connection(
                stream,
                router.clone(),
                &limits,
                state.clone(),
                stop,
                conn_counters.clone(),
            );
            Measured {
                inner: Box::pin(conn),
                state,
                waker,
            }
        },
    )
    .await;
}

/// The one accept and drain loop of every listener (HTTP, gRPC, RESP):
/// accepts until `shutdown` resolves, closing at accept what would pass
/// `capacity` connections open (counted `refused`); `start` makes a
/// connection's future from its socket, the number open before it, and
/// the signal that the listener stops. At shutdown the listener closes, the
/// connections are told to stop and are waited for `drain_timeout` at most
/// ([`drain`]).
pub(crate) async fn listen<F, S>(
    listener: TcpListener,
    counters: &ConnCounters,
    capacity: usize,
    drain_timeout: Duration,
    shutdown: impl Future<Output = ()>,
    mut start: S,
) where
    S: FnMut(TcpStream, usize, watch::Receiver<bool>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {
                counters.open.dec();
            }
            accepted = accept(&listener) => {
                let Some(stream) = accepted else { continue };
                let open = conns.len();
                if open >= capacity {
                    counters.refused.inc();
                    drop(stream);
                    continue;
                }
                let _ = stream.set_nodelay(true);
                let conn = start(stream, open, stop_rx.clone());
                counters.open.inc();
                conns.spawn(conn);
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drain(conns, counters, drain_timeout).await;
}

/// The next connection; `None` after a failed accept (out of file
/// descriptors or memory), having waited 50 ms so the connections in
/// progress can finish before the listener tries again ([`listen`]).
async fn accept(listener: &TcpListener) -> Option<TcpStream> {
    match listener.accept().await {
        Ok((stream, _peer)) => Some(stream),
        Err(e) => {
            tracing::warn!(error = %e, "accept failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

/// Waits for the connections told to stop, `timeout` at most, then closes
/// what is left; `counters.open` follows each one closed ([`listen`]).
async fn drain<T: 'static>(mut conns: JoinSet<T>, counters: &ConnCounters, timeout: Duration) {
    let drained = tokio::time::timeout(timeout, async {
        while conns.join_next().await.is_some() {
            counters.open.dec();
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = conns.len(),
            "connections still open after the drain timeout; closing them"
        );
        conns.abort_all();
        while conns.join_next().await.is_some() {
            counters.open.dec();
        }
    }
}

/// One connection, from accept to close.
fn connection(
    stream: TcpStream,
    router: Router,
    limits: &ConnLimits,
    state: Arc<ConnState>,
    mut stop: watch::Receiver<bool>,
    counters: ConnCounters,
) -> impl Future<Output = ()> + Send + 'static + use<> {
    let first = limits.first_request_timeout.unwrap_or(limits.idle_timeout);
    let (header, idle, first) = if state.probe_only {
        (
            limits.header_timeout.min(PROBE_TIMEOUT),
            limits.idle_timeout.min(PROBE_TIMEOUT),
            first.min(PROBE_TIMEOUT),
        )
    } else {
        (limits.header_timeout, limits.idle_timeout, first)
    };
    let http2_only = limits.http2_only;
    let tls = limits.tls.clone();
    async move {
        let proto = if http2_only {
            crate::tls::Proto::Grpc
        } else {
            crate::tls::Proto::Http
        };
        // The handshake has a request head's deadline.
        let Some(stream) = crate::tls::accept(tls.as_ref(), proto, stream, header).await else {
            return;
        };
        let conn_ext = Conn(state.clone());
        let svc_state = state.clone();
        let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            let busy = Busy::new(&svc_state);
            req.extensions_mut().insert(conn_ext.clone());
            let call = router.clone().oneshot(req.map(axum::body::Body::new));
            async move {
                let r = call.await;
                drop(busy);
                r
            }
        });
        let io = TokioIo::new(Tracked {
            io: stream,
            state: state.clone(),
            out: Coalesced::default(),
        });
        // HTTP/1.1, or HTTP/2 when the connection opens with its preface
        // (h2c with prior knowledge), on the same port.
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        if http2_only {
            builder = builder.http2_only();
        }
        builder
            .http1()
            .timer(TokioTimer::new())
            // hyper's own head timer runs from the moment a connection waits
            // for a request, idle time included: a backstop behind the
            // watchdog, which tells idle from slow.
            .header_read_timeout(header + idle)
            .max_buf_size(H1_MAX_BUF)
            .keep_alive(true);
        builder
            .http2()
            .timer(TokioTimer::new())
            // Streams at once per connection: each is a request in flight,
            // which the in-flight cap counts too.
            .max_concurrent_streams(H2_MAX_STREAMS)
            // Headers of one request, as HTTP/1's head is bounded by hyper.
            .max_header_list_size(H2_MAX_HEADER_LIST)
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONN_WINDOW)
            .keep_alive_interval(Some(H2_PING_INTERVAL))
            .keep_alive_timeout(H2_PING_TIMEOUT);
        let conn = builder.serve_connection(io, svc);
        tokio::pin!(conn);
        let dog = watchdog(state, header, idle, first);
        tokio::pin!(dog);
        let mut draining = false;
        loop {
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = &mut dog => {
                    counters.timed_out.inc();
                    return;
                }
                changed = stop.changed(), if !draining => {
                    draining = true;
                    if changed.is_ok() {
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What an HTTP/2 connection writes arrives whole and in order, whether
    /// gathered (under [`COALESCE_MAX`]), past the gathered size, or larger
    /// than it, and nothing is held back once flushed.
    #[tokio::test]
    async fn gathered_writes_arrive_whole_and_in_order() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let state = Arc::new(ConnState::new(false, true));
        state.proto.store(PROTO_HTTP2, Ordering::Relaxed);
        let mut w = Tracked {
            io: Stream::Plain(server),
            state,
            out: Coalesced::default(),
        };
        assert!(!w.is_write_vectored(), "h2 must copy small payloads");
        // Writes of 1 byte to 3 × COALESCE_MAX: some gathered, some forcing
        // a drain, some written straight.
        let sizes = [
            1,
            300,
            1024,
            COALESCE_MAX - 1,
            5,
            COALESCE_MAX * 3,
            7,
            4000,
            4000,
        ];
        let mut sent = Vec::new();
        let mut n = 0u8;
        for size in sizes {
            let chunk: Vec<u8> = (0..size)
                .map(|_| {
                    n = n.wrapping_add(1);
                    n
                })
                .collect();
            // Half as one slice, half split in two (a vectored write).
            if size % 2 == 0 {
                let (a, b) = chunk.split_at(size / 2);
                let mut bufs = [std::io::IoSlice::new(a), std::io::IoSlice::new(b)];
                let mut bufs = &mut bufs[..];
                let mut left = size;
                while left > 0 {
                    let k = w.write_vectored(bufs).await.unwrap();
                    left -= k;
                    std::io::IoSlice::advance_slices(&mut bufs, k);
                }
            } else {
                w.write_all(&chunk).await.unwrap();
            }
            sent.extend_from_slice(&chunk);
        }
        w.flush().await.unwrap();
        assert!(w.out.buf.is_empty(), "a flush leaves nothing gathered");
        let mut got = vec![0; sent.len()];
        let mut client = client;
        tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, sent);
        w.shutdown().await.unwrap();
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        assert!(rest.is_empty());
    }

    /// HTTP/1 connections keep vectored writes and are not gathered.
    #[tokio::test]
    async fn http1_writes_are_not_gathered() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let state = Arc::new(ConnState::new(false, false));
        state.proto.store(PROTO_HTTP1, Ordering::Relaxed);
        let mut w = Tracked {
            io: Stream::Plain(server),
            state,
            out: Coalesced::default(),
        };
        assert!(w.is_write_vectored());
        w.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        assert!(w.out.buf.is_empty(), "HTTP/1 bytes go straight out");
        let mut got = [0; 19];
        let mut client = client;
        tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, b"HTTP/1.1 200 OK\r\n\r\n");
    }
}
