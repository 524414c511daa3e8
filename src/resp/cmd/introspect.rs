//! `COMMAND` and `INFO`: what clients ask a server about itself. redis-cli
//! reads `COMMAND DOCS` for its hints, and ioredis's ready check reads
//! `INFO`'s `loading:0`; both must get an answer of the right shape.

use super::super::frame::Reply;
use super::connection::REDIS_VERSION;
use super::{COMMANDS, eq};

/// `COMMAND`, `COMMAND COUNT|LIST|INFO name...|DOCS [name...]`.
pub fn command(args: &[&[u8]]) -> Reply {
    let Some(sub) = args.first() else {
        return Reply::Array(COMMANDS.iter().map(entry).collect());
    };
    if eq(sub, "COUNT") {
        Reply::Int(i64::try_from(COMMANDS.len()).unwrap_or(i64::MAX))
    } else if eq(sub, "LIST") {
        Reply::Array(COMMANDS.iter().map(|c| Reply::bulk(c.name)).collect())
    } else if eq(sub, "INFO") {
        Reply::Array(
            args[1..]
                .iter()
                .map(|n| find(n).map_or(Reply::Null, entry))
                .collect(),
        )
    } else if eq(sub, "DOCS") {
        // No documentation entries: an empty map is what Redis answers for
        // names it has no docs for, and clients then show no hints.
        Reply::Map(Vec::new())
    } else {
        Reply::error(format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(sub)
        ))
    }
}

fn find(name: &[u8]) -> Option<&'static super::CommandInfo> {
    COMMANDS.iter().find(|c| eq(name, c.name))
}

/// One command's entry as Redis's `COMMAND` gives it: name, arity, flags,
/// first key, last key, key step.
fn entry(c: &super::CommandInfo) -> Reply {
    Reply::Array(vec![
        Reply::bulk(c.name),
        Reply::Int(c.arity),
        Reply::Array(c.flags.iter().map(|f| Reply::Simple(f)).collect()),
        // One key at most: last = first, step 1 (0 without a key).
        Reply::Int(c.first_key),
        Reply::Int(c.first_key),
        Reply::Int(i64::from(c.first_key > 0)),
    ])
}

/// `CONFIG GET pattern...`: no parameter is readable, so the answer is
/// empty, as Redis's is for names it does not know (redis-benchmark asks for
/// `save` and `appendonly` and prints them). Other subcommands are errors.
pub fn config(args: &[&[u8]]) -> Reply {
    match args.first() {
        Some(sub) if eq(sub, "GET") && args.len() >= 2 => Reply::Map(Vec::new()),
        Some(sub) if eq(sub, "GET") => super::arity("config|get"),
        Some(sub) => Reply::error(format!(
            "ERR CONFIG {} is not supported: freqcap is configured by its own file, flags and environment",
            String::from_utf8_lossy(sub)
        )),
        None => super::arity("config"),
    }
}

/// What `INFO` reports besides constants.
pub struct InfoFigures {
    /// `tcp_port`: the port bound, not the one configured (which may be 0).
    pub port: u16,
    /// `uptime_in_seconds`, from the listener's start.
    pub uptime_s: u64,
    /// `connected_clients`: `freqcap_resp_connections_open` now.
    pub clients: u64,
}

/// `INFO [section ...]`: the server, clients, persistence and replication
/// sections, with the fields client libraries read.
pub fn info(args: &[&[u8]], f: &InfoFigures) -> Reply {
    let sections: [(&str, String); 4] = [
        (
            "server",
            format!(
                "# Server\r\nredis_version:{REDIS_VERSION}\r\nfreqcap_version:{}\r\n\
                 redis_mode:standalone\r\nos:{}\r\narch_bits:{}\r\ntcp_port:{}\r\n\
                 uptime_in_seconds:{}\r\n",
                env!("CARGO_PKG_VERSION"),
                std::env::consts::OS,
                usize::BITS,
                f.port,
                f.uptime_s
            ),
        ),
        (
            "clients",
            format!("# Clients\r\nconnected_clients:{}\r\n", f.clients),
        ),
        // `loading:0` is what ioredis's ready check waits for.
        ("persistence", "# Persistence\r\nloading:0\r\n".to_owned()),
        (
            "replication",
            "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n".to_owned(),
        ),
    ];
    // Redis's aliases for every section; an unknown name selects nothing.
    let all = args.is_empty()
        || args
            .iter()
            .any(|a| eq(a, "all") || eq(a, "default") || eq(a, "everything"));
    let text: Vec<&str> = sections
        .iter()
        .filter(|(name, _)| all || args.iter().any(|a| eq(a, name)))
        .map(|(_, t)| t.as_str())
        .collect();
    Reply::bulk(text.join("\r\n"))
}
