//! The commands clients send to set up a connection (docs/resp.md,
//! "Handshake"): `HELLO`, `AUTH`, `PING`, `ECHO`, `SELECT`, `CLIENT ...`,
//! `RESET`. Client libraries fail to connect without some of them (redis-py
//! 8 sends `HELLO 3` first; a failing `CLIENT SETNAME` fails its connection),
//! so each answers as Redis 7 does, in Redis's words.

use super::super::frame::Reply;
use super::{Session, arity, eq};

/// The most bytes of a client name or library name/version kept: a client
/// cannot grow the session past it.
const MAX_NAME: usize = 256;

/// Failed `AUTH`s after which a connection is closed. Unbounded, one
/// connection took 2 000 pipelined wrong AUTHs in 0.7 ms (security probe,
/// turn 3, case 1.50): about 2.8 M guesses a second. Closing at the tenth
/// makes every ten guesses cost a new connection; a client with the right
/// token never needs a second try.
pub const MAX_FAILED_AUTHS: u32 = 10;

/// The Redis version the front reports in `HELLO` and `INFO`: the level of
/// the protocol and handshake it answers like (clients gate features on it).
pub const REDIS_VERSION: &str = "7.0.0";

/// `HELLO [protover [AUTH user pass] [SETNAME name]]`. Nothing changes
/// unless the whole command is good.
pub fn hello(s: &mut Session, args: &[&[u8]], tokens: &Tokens) -> Reply {
    let mut proto = s.proto;
    if let Some(v) = args.first() {
        match std::str::from_utf8(v)
            .ok()
            .and_then(|v| v.parse::<i64>().ok())
        {
            Some(2) => proto = 2,
            Some(3) => proto = 3,
            // Redis's word for a protocol version it does not speak.
            Some(_) => return Reply::error("NOPROTO unsupported protocol version"),
            None => {
                return Reply::error("ERR Protocol version is not an integer or out of range");
            }
        }
    }
    let mut authed = s.authed;
    let mut name = None;
    let mut i = 1;
    while i < args.len() {
        let rest = args.len() - i - 1;
        if eq(args[i], "AUTH") && rest >= 2 {
            if !tokens.accepts(Some(args[i + 1]), args[i + 2]) {
                return wrongpass(s);
            }
            authed = true;
            i += 3;
        } else if eq(args[i], "SETNAME") && rest >= 1 {
            if let Err(e) = check_name(args[i + 1]) {
                return e;
            }
            name = Some(args[i + 1]);
            i += 2;
        } else {
            return Reply::error(format!(
                "ERR Syntax error in HELLO option '{}'",
                String::from_utf8_lossy(args[i])
            ));
        }
    }
    if !authed {
        return Reply::error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
             HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
             select the RESP protocol version at the same time",
        );
    }
    s.proto = proto;
    s.authed = authed;
    if let Some(n) = name {
        s.set_name(n);
    }
    // Redis's fields: no cluster, no replica to follow.
    Reply::Map(vec![
        ("server", Reply::bulk("freqcap")),
        ("version", Reply::bulk(REDIS_VERSION)),
        ("proto", Reply::Int(i64::from(proto))),
        ("id", Reply::Int(i64::try_from(s.id).unwrap_or(i64::MAX))),
        ("mode", Reply::bulk("standalone")),
        ("role", Reply::bulk("master")),
        ("modules", Reply::Array(Vec::new())),
    ])
}

/// The tokens a connection may authenticate with: the decision token, or
/// the admin token (which may do anything the decision token may).
pub struct Tokens {
    /// `decision_token`: every RESP command is a decision or a read.
    pub decision: Option<String>,
    /// `admin_token`, accepted too, as over HTTP (docs/semantics.md §8.6).
    pub admin: Option<String>,
}

impl Tokens {
    /// Whether connections must authenticate first.
    pub fn required(&self) -> bool {
        self.decision.is_some() || self.admin.is_some()
    }

    /// Whether `user` (absent, or `default` as Redis names its only user)
    /// and `password` match a token.
    fn accepts(&self, user: Option<&[u8]>, password: &[u8]) -> bool {
        // Redis's only user without ACLs: any other name is wrong.
        if user.is_some_and(|u| u != b"default") {
            return false;
        }
        // In constant time, by HTTP's comparison.
        [&self.decision, &self.admin]
            .into_iter()
            .flatten()
            .any(|t| crate::front::access::token_matches(password, t))
    }
}

/// Redis's answer to a wrong token, counted against the connection.
fn wrongpass(s: &mut Session) -> Reply {
    s.failed_auths = s.failed_auths.saturating_add(1);
    Reply::error("WRONGPASS invalid username-password pair or user is disabled.")
}

/// `AUTH [user] password`. A success leaves the failure count as it is:
/// it counts guesses for the connection's life (see [`MAX_FAILED_AUTHS`]).
pub fn auth(s: &mut Session, args: &[&[u8]], tokens: &Tokens) -> Reply {
    let (user, password) = match args {
        [p] => (None, *p),
        [u, p] => (Some(*u), *p),
        _ => return arity("auth"),
    };
    // Redis's answer: a client sending a password here is misconfigured.
    if !tokens.required() {
        return Reply::error(
            "ERR AUTH <password> called without any password configured for the default user. \
             Are you sure your configuration is correct?",
        );
    }
    if tokens.accepts(user, password) {
        s.authed = true;
        Reply::Simple("OK")
    } else {
        wrongpass(s)
    }
}

/// `PING [message]`.
pub fn ping(args: &[&[u8]]) -> Reply {
    match args {
        [] => Reply::Simple("PONG"),
        [m] => Reply::bulk(*m),
        _ => arity("ping"),
    }
}

/// `ECHO message`.
pub fn echo(args: &[&[u8]]) -> Reply {
    match args {
        [m] => Reply::bulk(*m),
        _ => arity("echo"),
    }
}

/// `SELECT index`: there is one database, 0.
pub fn select(args: &[&[u8]]) -> Reply {
    let [db] = args else {
        return arity("select");
    };
    match std::str::from_utf8(db)
        .ok()
        .and_then(|d| d.parse::<i64>().ok())
    {
        Some(0) => Reply::Simple("OK"),
        Some(_) => Reply::error("ERR DB index is out of range"),
        None => Reply::error("ERR value is not an integer or out of range"),
    }
}

/// A client or library name: printable ASCII without spaces, as Redis
/// requires, and at most [`MAX_NAME`] bytes.
fn check_name(n: &[u8]) -> Result<(), Reply> {
    if !n.iter().all(|&b| (b'!'..=b'~').contains(&b)) {
        return Err(Reply::error(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    if n.len() > MAX_NAME {
        return Err(Reply::error(format!(
            "ERR Client names are at most {MAX_NAME} bytes here"
        )));
    }
    Ok(())
}

/// `CLIENT SETNAME|GETNAME|ID|SETINFO|INFO`; other subcommands (e.g.
/// `CLIENT MAINT_NOTIFICATIONS`, which redis-py tries and tolerates failing)
/// get Redis's unknown-subcommand error.
pub fn client(s: &mut Session, args: &[&[u8]]) -> Reply {
    let Some(sub) = args.first() else {
        return arity("client");
    };
    let rest = &args[1..];
    if eq(sub, "SETNAME") {
        let [n] = rest else {
            return arity("client|setname");
        };
        if let Err(e) = check_name(n) {
            return e;
        }
        s.set_name(n);
        Reply::Simple("OK")
    } else if eq(sub, "GETNAME") {
        match &s.name {
            Some(n) => Reply::bulk(n.as_bytes()),
            None => Reply::Null,
        }
    } else if eq(sub, "ID") {
        Reply::Int(i64::try_from(s.id).unwrap_or(i64::MAX))
    } else if eq(sub, "SETINFO") {
        let [attr, value] = rest else {
            return arity("client|setinfo");
        };
        if let Err(e) = check_name(value) {
            return e;
        }
        let v = String::from_utf8_lossy(value).into_owned();
        if eq(attr, "LIB-NAME") {
            s.lib_name = Some(v);
        } else if eq(attr, "LIB-VER") {
            s.lib_ver = Some(v);
        } else {
            return Reply::error(format!(
                "ERR Unrecognized option '{}'",
                String::from_utf8_lossy(attr)
            ));
        }
        Reply::Simple("OK")
    } else if eq(sub, "INFO") {
        Reply::bulk(format!(
            "id={} name={} resp={} lib-name={} lib-ver={}\n",
            s.id,
            s.name.as_deref().unwrap_or(""),
            s.proto,
            s.lib_name.as_deref().unwrap_or(""),
            s.lib_ver.as_deref().unwrap_or(""),
        ))
    } else {
        Reply::error(format!(
            "ERR unknown subcommand '{}'. Try CLIENT HELP.",
            String::from_utf8_lossy(sub)
        ))
    }
}
