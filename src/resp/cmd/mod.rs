//! The RESP commands, one concern per file (like mini-redis's `cmd/`):
//! [`throttle`] (`CL.THROTTLE`) and [`check`] (`FC.CHECK`) translate to the
//! engine's check; [`connection`] and [`introspect`] answer the handshake
//! and questions clients ask about the server. This file routes a command
//! to its handler and applies what every decision passes first: auth and
//! load shedding, shared with HTTP (docs/resp.md).
//!
//! An error's first word is its kind to a Redis client, so each comes from
//! what the caller expects to be talking to:
//! - Redis's (`ERR`, `NOAUTH`, `WRONGPASS`, `NOPROTO`) for the protocol,
//!   the handshake and unknown commands, so clients classify them as ever;
//! - redis-cell's `Cell error: Store error: ...` for `CL.THROTTLE`'s
//!   arguments and refusals ([`throttle`]), so its callers see no change;
//! - [`Code::resp_word`](crate::front::error::Code::resp_word) for what the
//!   engine or shedding answer (`NOT_FOUND`, `OVERLOADED`, ...), which
//!   neither has a word for: the code HTTP's and gRPC's statuses come from.

pub mod check;
pub mod connection;
pub mod introspect;
pub mod throttle;

use crate::clock::Clock;
use crate::engine::{CheckRequest, Engine, ThrottleRequest, Throttled};
use crate::front::FrontError;
use crate::front::outcome::Checked;
use crate::front::shed::{self, InFlight};
use crate::server::Conn;
use prometheus_client::metrics::counter::Counter;

use super::Front;
use super::frame::Reply;

/// One connection's state.
#[derive(Debug)]
pub struct Session {
    /// RESP version spoken: 2 until `HELLO 3`.
    pub proto: u8,
    /// Whether commands past the handshake may run; true at once without
    /// tokens.
    pub authed: bool,
    /// `CLIENT ID`: kept across `RESET` (the same connection).
    pub id: u64,
    /// The name `CLIENT SETNAME` gave, for `CLIENT GETNAME` and `CLIENT INFO`.
    pub name: Option<String>,
    /// `CLIENT SETINFO LIB-NAME`, kept only for `CLIENT INFO`.
    pub lib_name: Option<String>,
    /// `CLIENT SETINFO LIB-VER`, likewise.
    pub lib_ver: Option<String>,
    /// `AUTH`s (and `HELLO ... AUTH`s) refused on this connection, `RESET`
    /// included: at [`connection::MAX_FAILED_AUTHS`] it is closed.
    pub failed_auths: u32,
}

impl Session {
    /// A fresh connection's state (and `RESET`'s): RESP2, no names.
    pub fn new(id: u64, authed: bool) -> Session {
        Session {
            proto: 2,
            authed,
            id,
            name: None,
            lib_name: None,
            lib_ver: None,
            failed_auths: 0,
        }
    }

    /// An empty name clears it, as in Redis.
    fn set_name(&mut self, n: &[u8]) {
        self.name = (!n.is_empty()).then(|| String::from_utf8_lossy(n).into_owned());
    }
}

/// What the connection does after answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Read and answer the next command.
    Go,
    /// Close once the reply is written (`QUIT`).
    Close,
}

/// A command as `COMMAND` describes it.
pub struct CommandInfo {
    /// Lower case, as `COMMAND` lists names and the metrics label them.
    pub name: &'static str,
    /// Redis's arity: exact if positive, at least −arity if negative (the
    /// command's name counted).
    pub arity: i64,
    /// Redis's flags, as `COMMAND` reports them; `no_auth` marks the four a
    /// client may send before `AUTH` (`dispatch`'s gate).
    pub flags: &'static [&'static str],
    /// Position of the key argument, 0 if none.
    pub first_key: i64,
}

/// A [`CommandInfo`] in one line of [`COMMANDS`].
const fn cmd(
    name: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    first_key: i64,
) -> CommandInfo {
    CommandInfo {
        name,
        arity,
        flags,
        first_key,
    }
}

/// Every command served; the metrics label a command by one of these names
/// (or `other`), so clients cannot grow the number of series.
pub const COMMANDS: &[CommandInfo] = &[
    cmd("cl.throttle", -5, &["write", "fast"], 1),
    cmd("fc.check", -3, &["write", "fast"], 2),
    cmd("del", -2, &["write"], 1),
    cmd("hello", -1, &["fast", "no_auth"], 0),
    cmd("auth", -2, &["fast", "no_auth"], 0),
    cmd("ping", -1, &["fast"], 0),
    cmd("echo", 2, &["fast"], 0),
    cmd("select", 2, &["fast"], 0),
    cmd("client", -2, &["fast"], 0),
    cmd("command", -1, &["loading"], 0),
    cmd("info", -1, &["loading"], 0),
    cmd("config", -2, &["admin"], 0),
    cmd("quit", -1, &["fast", "no_auth"], 0),
    cmd("reset", 1, &["fast", "no_auth"], 0),
];

/// Whether an argument is `word`, in any case.
pub fn eq(arg: &[u8], word: &str) -> bool {
    arg.eq_ignore_ascii_case(word.as_bytes())
}

/// Whether a command's name shows an HTTP request, read as commands: its
/// request line (`POST / HTTP/1.1`) or its `Host:` header. A web page can
/// make a browser POST `text/plain` to any port without a preflight, and
/// the body's lines would run as commands; Redis (≥ 3.2.7, its
/// `securityWarningCommand`) closes the connection on these two names, and
/// so does the front (docs/resp.md, "Security").
pub fn cross_protocol(name: &[u8]) -> bool {
    eq(name, "POST") || eq(name, "Host:")
}

/// Redis's wrong-arity error.
pub fn arity(name: &str) -> Reply {
    Reply::error(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

/// Redis's unknown-command error: the name and the first arguments quoted.
fn unknown(name: &[u8], args: &[&[u8]]) -> Reply {
    let quoted: String = args
        .iter()
        .take(8)
        .map(|a| {
            let a = String::from_utf8_lossy(&a[..a.len().min(128)]).into_owned();
            format!("'{a}' ")
        })
        .collect();
    Reply::error(format!(
        "ERR unknown command '{}', with args beginning with: {quoted}",
        String::from_utf8_lossy(&name[..name.len().min(128)])
    ))
}

/// An engine error in Redis's form: the API's error code, upper-cased, as
/// the error's first word (`INVALID_ARGUMENT key: ...`, `OVERLOADED ...`).
fn api_error(e: &FrontError) -> Reply {
    Reply::error(format!("{} {}", e.code.resp_word(), e.message))
}

/// Answers one command. `args` holds the name first.
pub async fn run<C: Clock + 'static>(
    front: &Front<C>,
    s: &mut Session,
    conn: Option<&Conn>,
    args: &[&[u8]],
) -> (Reply, Next) {
    let Some((&name, rest)) = args.split_first() else {
        return (Reply::Simple("OK"), Next::Go);
    };
    let index = COMMANDS
        .iter()
        .position(|c| eq(name, c.name))
        .unwrap_or(COMMANDS.len());
    let label = COMMANDS.get(index).map_or("other", |c| c.name);
    let (reply, next) = dispatch(front, s, conn, label, name, rest).await;
    let ok = !matches!(reply, Reply::Error(_));
    front.counters.commands[index][usize::from(ok)].inc();
    (reply, next)
}

/// Where a decision came from, for the decisions metric.
#[derive(Clone, Copy)]
enum Endpoint {
    /// `CL.THROTTLE`: index 0 of [`Counters`]'s decisions.
    Throttle = 0,
    /// `FC.CHECK`: index 1.
    Check = 1,
}

/// Handles on the front's metric series, made once (see
/// [`crate::front::Metrics::resp_command_counter`]).
pub struct Counters {
    /// Per command of [`COMMANDS`] then `other`: [error, ok].
    commands: Vec<[Counter; 2]>,
    /// Per [`Endpoint`], per outcome of [`Checked::ALL`].
    decisions: [[Counter; 4]; 2],
}

impl Counters {
    /// Every series a command can touch, so counting needs no label lookup.
    pub fn new(m: &crate::front::Metrics) -> Counters {
        let names = COMMANDS.iter().map(|c| c.name).chain(["other"]);
        let decided = |endpoint| Checked::ALL.map(|c| m.decisions_counter(endpoint, c.as_str()));
        Counters {
            commands: names
                .map(|n| {
                    [
                        m.resp_command_counter(n, false),
                        m.resp_command_counter(n, true),
                    ]
                })
                .collect(),
            decisions: [decided("CL.THROTTLE"), decided("FC.CHECK")],
        }
    }
}

/// The auth gate, then the handler of `label` (`other`: unknown).
async fn dispatch<C: Clock + 'static>(
    front: &Front<C>,
    s: &mut Session,
    conn: Option<&Conn>,
    label: &'static str,
    name: &[u8],
    args: &[&[u8]],
) -> (Reply, Next) {
    let go = |r: Reply| (r, Next::Go);
    // Before authenticating, only what a client needs to authenticate.
    // Redis's `NOAUTH`, not `UNAUTHENTICATED`: the word Redis clients
    // recognise as an authentication error.
    if !s.authed && !matches!(label, "hello" | "auth" | "quit" | "reset") {
        return go(Reply::error("NOAUTH Authentication required."));
    }
    match label {
        "cl.throttle" => go(match throttle::parse(args) {
            Err(e) => e,
            Ok(req) => match decide_throttle(front, conn, req).await {
                Ok(Ok(out)) => throttle::answer(&out),
                // redis-cell's refusal (a refund into the past), its words.
                Ok(Err(refused)) => refused.into(),
                // Overload or an unavailable store, in freqcap's words.
                Err(e) => api_error(&e),
            },
        }),
        "fc.check" => go(match check::parse(args) {
            Err(e) => e,
            Ok(req) => match decide(front, conn, req, Endpoint::Check).await {
                Ok(out) => check::answer(&out),
                Err(e) => api_error(&e),
            },
        }),
        "del" if args.is_empty() => go(arity("del")),
        "del" => go(delete_throttles(front, args).await),
        "hello" | "auth" => {
            let reply = if label == "auth" {
                connection::auth(s, args, &front.tokens)
            } else {
                connection::hello(s, args, &front.tokens)
            };
            // Answered, then closed (docs/resp.md, "Security").
            if s.failed_auths >= connection::MAX_FAILED_AUTHS {
                front.state.metrics.resp_closed.auth_failures.inc();
                return (reply, Next::Close);
            }
            go(reply)
        }
        "ping" => go(connection::ping(args)),
        "echo" => go(connection::echo(args)),
        "select" => go(connection::select(args)),
        "client" => go(connection::client(s, args)),
        "command" => go(introspect::command(args)),
        "info" => go(introspect::info(args, &front.info_figures())),
        "config" => go(introspect::config(args)),
        "quit" => (Reply::Simple("OK"), Next::Close),
        "reset" => {
            // Forgets the authentication, not the failures: RESET must not
            // buy a guesser ten more tries.
            let failed_auths = s.failed_auths;
            *s = Session::new(s.id, !front.tokens.required());
            s.failed_auths = failed_auths;
            go(Reply::Simple("RESET"))
        }
        _ => go(unknown(name, args)),
    }
}

/// Sheds as HTTP's `/v1/check` does: when the connection waited too long
/// to run or too many requests are in flight (one counter with HTTP's).
/// The slot is held until dropped.
async fn admit<'f, C: Clock + 'static>(
    front: &'f Front<C>,
    conn: Option<&Conn>,
) -> Result<InFlight<'f>, FrontError> {
    let st = &front.state;
    if let Some(c) = conn {
        st.metrics.queue_delay(c.queue_delay().as_secs_f64());
    }
    // Shed as `default`: a RESP command's class is one of its arguments,
    // read after this.
    shed::too_busy(
        &st.shed,
        &st.options,
        &st.metrics,
        conn,
        Default::default(),
        shed::Work::Decide,
    )?;
    let waited = conn.map(Conn::queue_delay).unwrap_or_default();
    shed::admit(
        &st.shed,
        &st.options,
        &st.metrics,
        Default::default(),
        waited,
    )
    .await
}

/// Decides a check: shed ([`admit`]), then on the executor if every record
/// is in memory, else on a blocking thread.
async fn decide<C: Clock + 'static>(
    front: &Front<C>,
    conn: Option<&Conn>,
    req: CheckRequest,
    endpoint: Endpoint,
) -> Result<crate::engine::CheckOutcome, FrontError> {
    // Held for the decision, given back even if the future is dropped.
    let _slot = admit(front, conn).await?;
    let st = &front.state;
    let out =
        crate::front::call::in_memory_or_blocking(st, req, Engine::check_in_memory, Engine::check)
            .await?;
    front.counters.decisions[endpoint as usize][Checked::of_check(&out).index()].inc();
    Ok(out)
}

/// `DEL key [key ...]`: empties each `CL.THROTTLE` key's state, as
/// redis-cell documents a reset (docs/resp.md); answers how many had any,
/// as Redis's `DEL` answers how many it removed.
async fn delete_throttles<C: Clock + 'static>(front: &Front<C>, keys: &[&[u8]]) -> Reply {
    let e = front.state.engine.clone();
    let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
    let out = crate::front::call::blocking(move || {
        let mut n = 0;
        for k in &keys {
            n += i64::from(e.reset_throttle(k)?);
        }
        Ok(n)
    })
    .await;
    match out {
        Ok(n) => Reply::Int(n),
        Err(e) => api_error(&e),
    }
}

/// Decides a `CL.THROTTLE` as [`decide`] does a check; the key is copied
/// only when the decision moves to a blocking thread.
async fn decide_throttle<C: Clock + 'static>(
    front: &Front<C>,
    conn: Option<&Conn>,
    req: ThrottleRequest<'_>,
) -> Result<Throttled, FrontError> {
    let _slot = admit(front, conn).await?;
    let engine = &front.state.engine;
    // `in_memory_or_blocking` unrolled: the request borrows its key from
    // the read buffer, which a blocking thread cannot borrow.
    let out = match engine.throttle_in_memory(&req) {
        Some(r) => r?,
        None => {
            let (e, key, rate, quantity) =
                (engine.clone(), req.key.to_vec(), req.rate, req.quantity);
            crate::front::call::blocking(move || {
                e.throttle(&ThrottleRequest {
                    key: &key,
                    rate,
                    quantity,
                })
            })
            .await?
        }
    };
    // Counted only for a decision, not for redis-cell's error.
    if let Ok(o) = &out {
        let c = Checked::of_throttle(o.answer.limited, o.would_deny);
        front.counters.decisions[Endpoint::Throttle as usize][c.index()].inc();
    }
    Ok(out)
}
