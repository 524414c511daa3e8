//! Where the Redis protocol enters (docs/resp.md): `--resp-listen` serves
//! RESP2/RESP3 so that redis-cell's `CL.THROTTLE` callers, and any Redis
//! client, reach the engine by changing an address. A thin translation like
//! the HTTP front: [`frame`] reads commands and writes replies, [`cmd`]
//! turns each command into an engine call; the tokens, the in-flight cap,
//! load shedding and the metrics are HTTP's own ([`AppState`]).
//!
//! Why a second front: HTTP `check` reached only 0.8–0.9× a Redis+Lua GCRA on
//! this machine, its time going to the kernel and HTTP/JSON, not the
//! decision (~50 ns; BENCHMARKS.md). RESP costs a fraction of that per
//! request and pipelines: `CL.THROTTLE` on one key, 16 commands a pipeline,
//! answered 3.21× the requests/s of the Lua GCRA on Redis, memory store on
//! both sides (BENCHMARKS.md, "The Redis protocol front").
//!
//! How a command flows: [`serve`] accepts through the listen loop every
//! listener shares (`src/server.rs`), capped at `max_connections`; each
//! `connection` reads into one buffer, [`frame::parse`]s every whole
//! command in it, answers each with [`cmd::run`] in order, appends the
//! replies to one output buffer and writes it before reading again.
//!
//! Bounds, so that no client can make the server hold more than it allows
//! (docs/resp.md, "Limits", has the per-connection figure):
//! - one command is at most `max_command` bytes (HTTP's `max_body`), refused
//!   as soon as its announced lengths pass it, and is read into a buffer of
//!   at most that plus one read ([`make_room`]); before `AUTH`, Redis 7's
//!   smaller limits ([`PRE_AUTH_MAX_BULK`] ...);
//! - replies are written once [`FLUSH_AT`] bytes wait, and before more is
//!   read, so a client that does not read its replies stops being read (TCP
//!   pushes back) and is closed after `idle_timeout`; while they wait the
//!   connection holds them and the command under way, not what it answered;
//! - a command must arrive whole within `command_timeout` of its first byte.

pub mod cmd;
pub mod frame;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::tls::Stream;
use tokio::sync::watch;

use crate::clock::Clock;
use crate::front::AppState;
use crate::server::Conn;
use cmd::connection::Tokens;
use cmd::introspect::InfoFigures;
use cmd::{Next, Session};
use frame::Reply;

/// Limits of the RESP listener (docs/resp.md, "Limits").
#[derive(Debug, Clone)]
pub struct RespOptions {
    /// Connections served at once; past it a new one is closed at accept.
    pub max_connections: usize,
    /// How long a connection may stay idle between commands, or leave its
    /// replies unread.
    pub idle_timeout: Duration,
    /// From a command's first byte to its last.
    pub command_timeout: Duration,
    /// How long shutdown waits for connections to finish what they read.
    pub drain_timeout: Duration,
    /// The largest command, bytes (its arguments and framing).
    pub max_command: usize,
    /// TLS on this listener (`src/tls/`); the handshake has
    /// `command_timeout`.
    pub tls: Option<Arc<crate::tls::Tls>>,
}

/// Bytes asked of the socket per read: a few hundred pipelined checks.
const READ_CHUNK: usize = 16 * 1024;
/// Replies are written once this many bytes are waiting, even mid-batch.
const FLUSH_AT: usize = 64 * 1024;
/// The most arguments in one command: the longest command served takes 6;
/// `COMMAND INFO` with many names is the only long one.
const MAX_ARGS: usize = 1024;
/// Before `AUTH` (when tokens are set) a client may send what
/// authenticating needs, as Redis 7 allows (CVE-2021-32675): 10 arguments
/// of 16 KiB. Without it, 100 unauthenticated connections each sending most
/// of a 1 MiB bulk held 219 MB for `header_timeout` (security probe, turn 3,
/// case 1.26).
const PRE_AUTH_MAX_ARGS: usize = 10;
/// ... each of at most 16 KiB ...
const PRE_AUTH_MAX_BULK: usize = 16 * 1024;
/// ... and 64 KiB in all, the inline limit (Redis has no total limit).
const PRE_AUTH_MAX_COMMAND: usize = 64 * 1024;
/// A read buffer over this, once emptied, is given back (after a large
/// command, so an idle connection does not keep a `max_command` buffer).
const KEEP_READ_BUF: usize = 4 * READ_CHUNK;
/// How often a cross-protocol attempt is logged at most (Redis's period);
/// the metric counts them all.
const CROSS_PROTOCOL_LOG_EVERY_S: u64 = 60;

/// What the connections of one listener share.
pub struct Front<C: Clock> {
    /// HTTP's engine, options and metrics: one in-flight cap for both.
    state: Arc<AppState<C>>,
    /// HTTP's tokens, so one secret works on both ports.
    tokens: Tokens,
    /// What a command may be once authenticated, and before.
    limits: frame::Limits,
    /// Redis 7's small pre-`AUTH` limits, in force only with tokens set.
    pre_auth: frame::Limits,
    options: RespOptions,
    /// For `INFO`'s `uptime_in_seconds` and the cross-protocol log's pace.
    started: Instant,
    /// The bound port, for `INFO`'s `tcp_port` (the configured one may be 0).
    port: u16,
    /// `CLIENT ID`'s and `HELLO`'s `id`: unique per listener, from 1.
    next_id: AtomicU64,
    /// Metric handles made once at start, not looked up per command.
    counters: cmd::Counters,
    /// Seconds from `started` to the last cross-protocol warning, plus one
    /// (0: never).
    cross_protocol_logged: AtomicU64,
}

impl<C: Clock> Front<C> {
    /// The figures `INFO` reports that change while the server runs.
    fn info_figures(&self) -> InfoFigures {
        InfoFigures {
            port: self.port,
            uptime_s: self.started.elapsed().as_secs(),
            clients: u64::try_from(self.state.metrics.resp_connections.open.get()).unwrap_or(0),
        }
    }

    /// The limits a connection's next command is read with.
    fn limits(&self, authed: bool) -> &frame::Limits {
        if authed { &self.limits } else { &self.pre_auth }
    }

    /// Counts a connection closed for sending an HTTP request, and warns
    /// once a minute at most, so that an attack cannot flood the log.
    fn cross_protocol(&self, peer: Option<SocketAddr>) {
        self.state.metrics.resp_closed.cross_protocol.inc();
        let now = self.started.elapsed().as_secs() + 1;
        let last = self.cross_protocol_logged.load(Ordering::Relaxed);
        let due = last == 0 || now >= last + CROSS_PROTOCOL_LOG_EVERY_S;
        if due
            && self
                .cross_protocol_logged
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let peer = peer.map_or_else(|| "an unknown address".to_owned(), |p| p.to_string());
            tracing::warn!(
                "RESP: closed a connection from {peer} that sent an HTTP request (a command \
                 named POST or Host:), as a web page attacking the port through a browser \
                 would; logged once a minute at most, all counted in \
                 freqcap_resp_connections_closed_total{{reason=\"cross_protocol\"}}"
            );
        }
    }
}

/// Serves RESP on `listener` until `shutdown` resolves, then lets each
/// connection finish the commands it has read, for `drain_timeout` at most.
pub async fn serve<C: Clock + 'static>(
    listener: TcpListener,
    state: Arc<AppState<C>>,
    options: RespOptions,
    shutdown: impl Future<Output = ()>,
) {
    let port = listener.local_addr().map_or(0, |a: SocketAddr| a.port());
    let max_command = options.max_command;
    let counters = cmd::Counters::new(&state.metrics);
    let front = Arc::new(Front {
        tokens: Tokens {
            decision: state.options.decision_token.clone(),
            admin: state.options.admin_token.clone(),
        },
        limits: frame::Limits {
            max_bulk: max_command,
            max_args: MAX_ARGS,
            // Redis's inline limit: a person types these, not a client.
            max_inline: max_command.min(64 * 1024),
            max_command,
            pre_auth: false,
        },
        pre_auth: frame::Limits {
            max_bulk: max_command.min(PRE_AUTH_MAX_BULK),
            max_args: PRE_AUTH_MAX_ARGS,
            max_inline: max_command.min(PRE_AUTH_MAX_COMMAND),
            max_command: max_command.min(PRE_AUTH_MAX_COMMAND),
            pre_auth: true,
        },
        state,
        options,
        started: Instant::now(),
        port,
        next_id: AtomicU64::new(1),
        counters,
        cross_protocol_logged: AtomicU64::new(0),
    });
    let counters = front.state.metrics.resp_connections.clone();
    let (capacity, drain_timeout) = (front.options.max_connections, front.options.drain_timeout);
    crate::server::listen(
        listener,
        &counters,
        capacity,
        drain_timeout,
        shutdown,
        move |stream, _open, stop| {
            let front = front.clone();
            // Its queueing delay measured, for `cmd::admit` to shed on.
            crate::server::measured(move |conn| connection(front, stream, conn, stop))
        },
    )
    .await;
}

/// Writes `out` within the idle timeout; `false` if the client is gone or
/// does not read.
async fn flush(stream: &mut Stream, out: &mut Vec<u8>, timeout: Duration) -> bool {
    let ok = matches!(
        tokio::time::timeout(timeout, stream.write_all(out)).await,
        Ok(Ok(()))
    );
    out.clear();
    // Pipelined replies fill it to FLUSH_AT and a little over (its doubling
    // stops at 2 × FLUSH_AT); past that it held a large reply: give it back.
    if out.capacity() > 2 * FLUSH_AT {
        out.shrink_to(FLUSH_AT);
    }
    ok
}

/// Makes room in `buf` for a read, keeping it within a command of `max`
/// bytes and one read: it grows by doubling, as `Vec` does, but stops at
/// `max + READ_CHUNK` (Vec's own doubling took a 1 MiB command's buffer to
/// 2 MiB). The parser refuses a command over `max` before it needs more, so
/// `buf` never holds more than `max` when it is read into.
fn make_room(buf: &mut Vec<u8>, max: usize) {
    if buf.capacity() - buf.len() >= READ_CHUNK {
        return;
    }
    let cap = (buf.capacity().saturating_mul(2))
        .max(buf.len() + READ_CHUNK)
        .min(max.saturating_add(READ_CHUNK));
    buf.reserve_exact(cap.saturating_sub(buf.len()));
}

/// Gives back a read buffer grown for a large command once little of it is
/// used.
fn shrink(buf: &mut Vec<u8>) {
    if buf.len() < READ_CHUNK && buf.capacity() > KEEP_READ_BUF {
        buf.shrink_to(READ_CHUNK);
    }
}

/// One connection: read, answer every whole command in order, write the
/// replies, read again.
async fn connection<C: Clock + 'static>(
    front: Arc<Front<C>>,
    stream: TcpStream,
    conn: Conn,
    mut stop: watch::Receiver<bool>,
) {
    let o = &front.options;
    let tls = o.tls.as_ref();
    let Some(mut stream) =
        crate::tls::accept(tls, crate::tls::Proto::Resp, stream, o.command_timeout).await
    else {
        return;
    };
    let id = front.next_id.fetch_add(1, Ordering::Relaxed);
    let mut s = Session::new(id, !front.tokens.required());
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut out: Vec<u8> = Vec::with_capacity(1024);
    // When the first byte of a command still incomplete arrived.
    let mut partial_since: Option<Instant> = None;
    // When the connection last read anything: the idle timeout runs from it.
    let mut active_at = Instant::now();
    // One timer and one shutdown wait for the connection's life, moved
    // rather than made anew per read: registering and clearing a timer per
    // command showed in profiles of unpipelined load.
    let timer = tokio::time::sleep(o.idle_timeout);
    tokio::pin!(timer);
    let stopping = stop.changed();
    tokio::pin!(stopping);
    loop {
        let mut used = 0;
        let mut close = false;
        while used < buf.len() {
            // The limits change with AUTH, which may be in this batch.
            match frame::parse(&buf[used..], front.limits(s.authed)) {
                Ok(Some((args, n))) => {
                    let at = used;
                    used += n;
                    let args = args.slices(&buf[at..]);
                    // An empty command (`*0`, a blank line): skipped
                    // unanswered, as Redis does.
                    let Some(name) = args.first() else {
                        continue;
                    };
                    if cmd::cross_protocol(name) {
                        // Nothing after it runs, nor is anything answered.
                        front.cross_protocol(stream.peer_addr().ok());
                        return;
                    }
                    // The reply is dropped once written: a large one is not
                    // held twice while the client is slow to read.
                    let next = {
                        let (reply, next) = cmd::run(&front, &mut s, Some(&conn), &args).await;
                        // Room for a large reply (an ECHO) exactly, not by
                        // doubling: `out` stays within FLUSH_AT + one reply.
                        if let Reply::Bulk(b) = &reply
                            && b.len() > READ_CHUNK
                        {
                            out.reserve_exact(b.len() + 32);
                        }
                        reply.write(s.proto, &mut out);
                        next
                    };
                    if next == Next::Close {
                        close = true;
                        break;
                    }
                    if out.len() >= FLUSH_AT {
                        // The client may not read: while waiting, hold the
                        // replies and what is not answered yet, no more.
                        buf.drain(..used);
                        used = 0;
                        shrink(&mut buf);
                        if !flush(&mut stream, &mut out, o.idle_timeout).await {
                            return;
                        }
                    }
                }
                // The rest of `buf` is a command still arriving.
                Ok(None) => break,
                // Unreadable or over a limit: `-ERR Protocol error: ...`
                // after the replies queued, then closed as Redis does, since
                // nothing after it can be framed (docs/resp.md, "Limits").
                Err(e) => {
                    front.state.metrics.resp_protocol_errors.inc();
                    Reply::error(format!("ERR {e}")).write(s.proto, &mut out);
                    flush(&mut stream, &mut out, o.idle_timeout).await;
                    return;
                }
            }
        }
        // Replies written before reading again: a client that does not
        // read its replies stops being read.
        buf.drain(..used);
        shrink(&mut buf);
        if !out.is_empty() && !flush(&mut stream, &mut out, o.idle_timeout).await {
            return;
        }
        if close {
            return;
        }
        // Between commands the idle timeout; within one, the command
        // timeout from its first byte, so trickling cannot hold a buffer.
        let deadline = if buf.is_empty() {
            partial_since = None;
            active_at + o.idle_timeout
        } else {
            *partial_since.get_or_insert(active_at) + o.command_timeout
        };
        // The idle deadline moves with every command; the timer follows it
        // only once it is a second behind (an idle timeout a second late is
        // fine), and at once when a deadline comes sooner.
        let set = timer.deadline().into_std();
        if deadline < set || deadline > set + RESET_SLACK {
            timer.as_mut().reset(deadline.into());
        }
        make_room(&mut buf, front.limits(s.authed).max_command);
        tokio::select! {
            read = stream.read_buf(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => active_at = Instant::now(),
            },
            _ = &mut timer => {
                // A deadline passed; unless it was moved on since, close.
                if Instant::now() >= deadline {
                    front.state.metrics.resp_connections.timed_out.inc();
                    return;
                }
                timer.as_mut().reset(deadline.into());
            }
            // Shutting down: close between commands, never mid-command.
            _ = &mut stopping, if buf.is_empty() => return,
        }
    }
}

/// How far behind the idle deadline the timer may be before it is reset.
const RESET_SLACK: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    /// A command of `max` bytes arriving in reads of every size never makes
    /// the buffer larger than `max` and one read; emptied, it is given back.
    #[test]
    fn the_read_buffer_stays_within_a_command_and_one_read() {
        let max = 1 << 20;
        for read in [1000, READ_CHUNK - 1, READ_CHUNK, 3 * READ_CHUNK + 7] {
            let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
            for _ in 0..max {
                if buf.len() == max {
                    break;
                }
                make_room(&mut buf, max);
                assert!(buf.capacity() - buf.len() >= READ_CHUNK.min(max - buf.len()));
                // A read takes what the socket has, up to the room there is.
                let n = read.min(buf.capacity() - buf.len()).min(max - buf.len());
                buf.resize(buf.len() + n, b'x');
                assert!(
                    buf.capacity() <= max + READ_CHUNK,
                    "reads of {read}: {} bytes for a command of {max}",
                    buf.capacity()
                );
            }
            assert_eq!(buf.len(), max);
            buf.clear();
            shrink(&mut buf);
            assert!(buf.capacity() <= READ_CHUNK, "{}", buf.capacity());
        }
    }
}
