//! The load generator of BENCHMARKS.md: freqcap's HTTP API and the Redis+Lua
//! baseline driven by the same load shapes, from one process.
//!
//! A bench target (`harness = false`) rather than a `src/bin`: its client-only
//! dependency (hdrhistogram) stays a dev-dependency, out of the service's tree,
//! and `cargo test --all-targets` only builds it (run without a command it
//! prints its usage and exits 0).
//!
//! ```sh
//! cargo bench --bench loadgen --no-run          # then run the printed binary:
//! loadgen run --target freqcap --addr 127.0.0.1:8080 --workload screen --conns 32 --secs 5
//! loadgen run --target redis --addr 127.0.0.1:6390 --workload check-hot --rate 20000
//! loadgen fill --data-dir /tmp/fc10m --counters 10000000
//! loadgen restart --bin target/release/freqcap --data-dir /tmp/fc10m --repeat 3
//! ```
//!
//! The client is raw tokio TCP on a current-thread runtime (one core) with a
//! minimal HTTP/1.1 writer/parser and a minimal RESP writer/parser: every
//! connection keeps one request in flight (keep-alive, no pipelining).
//! The gRPC targets (`freqcap-grpc`: Check, Screen + Commit; `freqcap-rls`:
//! Envoy's `ShouldRateLimit`) use the tonic clients generated in the
//! library, one HTTP/2 connection per load connection (benches/grpc.sh).
//! With `--server-pid`, a run also reports the server's CPU, its own and
//! other processes' over the measured seconds (a shared machine shows).
//! With `--tls-ca FILE` the HTTP and RESP connections speak TLS (a server run
//! with `--tls-cert`); `--fresh-conns` opens one per request (handshake cost).
//! Open loop (`--rate R`): connection `i` of `N` sends at `t0 + (i + jN)/R`;
//! latency counts from that intended time, so a server that falls behind is
//! charged for the queue it causes (no coordinated omission). Closed loop
//! (`--rate 0`): each connection sends its next request when the answer
//! arrives.

use freqcap::grpc::pb::freqcap_client::FreqcapClient;
use freqcap::rls::pb::rate_limit_service_client::RateLimitServiceClient;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use tokio::net::TcpStream;
use tonic::transport::Channel;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn err(msg: impl Into<String>) -> Box<dyn std::error::Error + Send + Sync> {
    msg.into().into()
}

#[derive(Parser)]
#[command(name = "loadgen")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
enum Target {
    Freqcap,
    Redis,
    /// freqcap's RESP front (`--resp-listen`): `CL.THROTTLE` for the check
    /// workloads, the same arguments as the Redis GCRA's.
    FreqcapResp,
    /// freqcap's gRPC front (`--grpc-addr`, one HTTP/2 connection per load
    /// connection): `freqcap.v1.Freqcap/Check` for the check workloads,
    /// `Screen` then `Commit` for `screen`; `--addr` is the HTTP port, used
    /// to define the policy and the campaigns.
    FreqcapGrpc,
    /// Envoy's rate limit service on freqcap's gRPC front (`--grpc-addr`,
    /// served with `--rls-config`): `ShouldRateLimit` with three descriptors
    /// per request, `[client=K] [path=/api/N] [tenant=tT]`, for the check
    /// workloads (check-hot: one of each; check-1m: each drawn from `--keys`).
    /// The rules are the server's (benches/grpc.sh writes them).
    FreqcapRls,
    /// The Lua recipe (benches/lua) on a Redis Cluster, `--addr` one of its
    /// nodes (the slot map is read with `CLUSTER SLOTS`): users hash-tagged
    /// (`{u...}`) so a user's keys share a slot, one `screen.lua` on the
    /// user's primary, then the winner's `pay.lua` on its budget key and
    /// `release.lua` on the user's: three calls per ad, as a script may not
    /// touch two slots. `screen` only: the anchor of benches/cluster.sh.
    RedisCluster,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
enum Workload {
    /// `check` on one key (a GCRA rate limit; mostly denials once warm).
    CheckHot,
    /// `check` on keys drawn uniformly from 1 000 000.
    #[value(name = "check-1m")]
    Check1m,
    /// `screen` of K candidates for a Zipf user, then a commit of one winner.
    Screen,
    /// One impression event for a Zipf user and a random campaign.
    Events,
}

#[derive(clap::Args, Clone, Debug)]
struct RunArgs {
    #[arg(long, value_enum)]
    target: Target,
    #[arg(long)]
    addr: String,
    /// The gRPC address, for `--target freqcap-grpc` and `freqcap-rls`.
    #[arg(long)]
    grpc_addr: Option<String>,
    /// The server's process id: its CPU over the measured period is reported
    /// (`server_cpu`, in cores, from /proc/PID/stat).
    #[arg(long)]
    server_pid: Option<u32>,
    /// The rate limit domain of `--target freqcap-rls`.
    #[arg(long, default_value = "bench")]
    rls_domain: String,
    #[arg(long, value_enum)]
    workload: Workload,
    /// Connections (each one request in flight).
    #[arg(long, default_value_t = 32)]
    conns: usize,
    /// Operations per second, open loop; 0 is closed loop.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 5.0)]
    secs: f64,
    /// Warm-up seconds, not measured.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Candidates per screen.
    #[arg(long, default_value_t = 50)]
    k: usize,
    /// Users (Zipf ranks) for screen and events.
    #[arg(long, default_value_t = 1_000_000)]
    users: usize,
    /// Zipf exponent.
    #[arg(long, default_value_t = 0.99)]
    zipf: f64,
    /// Keys for check-1m.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// A tag written into the JSON line (e.g. the sweep step).
    #[arg(long, default_value = "")]
    tag: String,
    /// Print one JSON line instead of text.
    #[arg(long)]
    json: bool,
    /// After a screen run, read every committed (user, campaign)'s usage back
    /// and check no commit went over a cap.
    #[arg(long)]
    verify: bool,
    /// Also time `GET /healthz` on one more connection every 50 ms while the
    /// load runs (what a liveness probe sees under load).
    #[arg(long)]
    probe_healthz: bool,
    /// Behave as a well-mannered client: after a 503, wait the 1 s the
    /// server's `Retry-After` asks before sending on that connection again.
    #[arg(long)]
    honour_retry_after: bool,
    /// The share of HTTP checks and screens sent with `x-freqcap-priority: sheddable`
    /// (the rest as `default`), 0 to 1: the server sheds the lowest class
    /// first (docs/service.md); 503s are then counted per class too.
    #[arg(long, default_value_t = 0.0)]
    sheddable_share: f64,
    /// Throttle as freqcap's Rust client does (docs/clients.md, adaptive
    /// throttling, with this K; 0: off): one throttle for every connection,
    /// which rejects a request locally, without sending it, with the
    /// client's probability. Only 503 counts as a refusal here: check-hot's
    /// 429s are its limit's answers, not overload. Needs the load generator
    /// built with `--features client`.
    #[arg(long, default_value_t = 0.0)]
    client_throttle: f64,
    /// Open loop: a request whose connection frees up more than this many
    /// ms after its intended send time is dropped unsent (`expired`), as a
    /// caller with a deadline gives up (an ad request's budget); 0: never.
    #[arg(long, default_value_t = 0)]
    deadline_ms: u64,
    /// With several freqcap nodes in `--addr` (comma-separated): `spread`
    /// sends each user's requests to any node (connection i talks to node
    /// i mod n, users drawn freely); `affinity` keeps each user on one node
    /// (connection i draws only users u with u mod n = i mod n), as a load
    /// balancer hashing the user would (docs/cluster.md).
    #[arg(long, value_enum, default_value_t = Route::Spread)]
    route: Route,
    /// HTTP and RESP over TLS, trusting this CA (PEM; the server's
    /// certificate must name `localhost`): a server run with `--tls-cert`.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// A new connection for every request (HTTP and RESP targets): with
    /// `--tls-ca`, every request pays a full handshake, which the server's
    /// CPU (`--server-pid`) then shows against plaintext.
    #[arg(long)]
    fresh_conns: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
enum Route {
    Spread,
    Affinity,
}

impl RunArgs {
    /// The nodes in `--addr`.
    fn addrs(&self) -> Vec<&str> {
        self.addr
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect()
    }

    /// The node connection `i` talks to.
    fn addr_of(&self, i: usize) -> &str {
        let addrs = self.addrs();
        addrs
            .get(i % addrs.len().max(1))
            .copied()
            .unwrap_or(&self.addr)
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// One load run.
    Run(RunArgs),
    /// Fill a data dir with user counters through the Engine API.
    Fill {
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long, default_value_t = 10_000_000)]
        counters: u64,
    },
    /// Time `freqcap serve` from spawn until /readyz answers 200.
    Restart {
        #[arg(long)]
        bin: PathBuf,
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        #[arg(long)]
        json: bool,
    },
}

fn main() -> Res<()> {
    // `cargo bench` adds `--bench`; `cargo test --all-targets` runs us bare.
    let args: Vec<String> = std::env::args().filter(|a| a != "--bench").collect();
    if args.len() < 2 {
        println!("loadgen: no command given (run, fill, restart); see BENCHMARKS.md");
        return Ok(());
    }
    let cli = Cli::parse_from(args);
    match cli.command {
        Cmd::Run(a) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(run(a))
        }
        Cmd::Fill { data_dir, counters } => fill(&data_dir, counters),
        Cmd::Restart {
            bin,
            data_dir,
            repeat,
            json,
        } => restart(&bin, &data_dir, repeat, json),
    }
}

// ---- shared definitions: the same caps for both targets ----

/// The rate limit of `check`: CL.THROTTLE key 100 100 1 (burst 100 after
/// idling, 100 per second) on both sides.
const RATE: u64 = 100;
const BURST: u64 = 100;
/// Per-user caps of every screened campaign: 5 per fixed day, 3 per rolling hour.
const DAILY: u64 = 5;
const ROLLING: u64 = 3;
const ROLLING_MS: u64 = 3_600_000;
/// A budget no run exhausts (units per day).
const BUDGET: u64 = 1_000_000_000_000;

fn campaign_name(i: usize) -> String {
    format!("lg-c{i}")
}

// ---- a small PRNG and Zipf sampler ----

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        (((self.next() >> 11) as u128 * n as u128) >> 53) as u64
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Ranks 0..n with P(k) ∝ 1/(k+1)^s, by binary search in the CDF.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for k in 0..n {
            acc += 1.0 / ((k + 1) as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }
    fn sample(&self, r: &mut Rng) -> usize {
        let u = r.unit();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

// ---- connections: HTTP/1.1 and RESP over raw tokio TCP ----

/// The client side of `--tls-ca`, set once at start (`None`: plaintext).
static TLS: std::sync::OnceLock<Option<Arc<rustls::ClientConfig>>> = std::sync::OnceLock::new();

/// Reads `--tls-ca` into [`TLS`].
fn set_tls(ca: Option<&PathBuf>) -> Res<()> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let config = match ca {
        None => None,
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(path)? {
                roots.add(c?)?;
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut c = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots)
                .with_no_client_auth();
            c.alpn_protocols = vec![b"http/1.1".to_vec()];
            // Every handshake a full one: `--fresh-conns` measures the worst
            // case, not a resumed session.
            c.resumption = rustls::client::Resumption::disabled();
            Some(Arc::new(c))
        }
    };
    let _ = TLS.set(config);
    Ok(())
}

/// A connection's socket: plaintext, driven by `try_read`/`try_write`, or
/// TLS (`--tls-ca`).
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

struct Conn {
    s: Io,
    buf: Vec<u8>,
    /// Bytes of `buf` read from the socket.
    end: usize,
    /// Bytes at the front of `buf` belonging to the last answer.
    used: usize,
    /// The last answer's `x-freqcap-owner` (owner mode: the node that
    /// decided, when it was not the one asked).
    owner: Option<String>,
}

impl Conn {
    async fn connect(addr: &str) -> Res<Conn> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let s = match TLS.get().and_then(|t| t.clone()) {
            None => Io::Plain(tcp),
            Some(config) => {
                let name = rustls::pki_types::ServerName::try_from("localhost")?;
                let tls = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await?;
                Io::Tls(Box::new(tls))
            }
        };
        Ok(Conn {
            s,
            buf: vec![0; 64 * 1024],
            end: 0,
            used: 0,
            owner: None,
        })
    }

    async fn send(&mut self, mut data: &[u8]) -> Res<()> {
        // Drop the previous answer.
        self.buf.copy_within(self.used..self.end, 0);
        self.end -= self.used;
        self.used = 0;
        let s = match &mut self.s {
            Io::Plain(s) => s,
            Io::Tls(t) => {
                use tokio::io::AsyncWriteExt;
                t.write_all(data).await?;
                t.flush().await?;
                return Ok(());
            }
        };
        while !data.is_empty() {
            match s.try_write(data) {
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    s.writable().await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    async fn fill(&mut self) -> Res<()> {
        if self.end == self.buf.len() {
            let n = self.buf.len() * 2;
            self.buf.resize(n, 0);
        }
        let s = match &mut self.s {
            Io::Plain(s) => s,
            Io::Tls(t) => {
                use tokio::io::AsyncReadExt;
                let n = t.read(&mut self.buf[self.end..]).await?;
                if n == 0 {
                    return Err(err("connection closed"));
                }
                self.end += n;
                return Ok(());
            }
        };
        loop {
            match s.try_read(&mut self.buf[self.end..]) {
                Ok(0) => return Err(err("connection closed")),
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    s.readable().await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads one HTTP/1.1 answer: its status and the body's range in `buf`.
    async fn http_answer(&mut self) -> Res<(u16, std::ops::Range<usize>)> {
        loop {
            if let Some(h) = find(&self.buf[..self.end], b"\r\n\r\n") {
                let head = &self.buf[..h];
                let status: u16 = std::str::from_utf8(head.get(9..12).unwrap_or(b"000"))?
                    .parse()
                    .map_err(|_| err("bad status line"))?;
                let mut len = 0usize;
                self.owner = None;
                for line in head.split(|&b| b == b'\n') {
                    if line.len() > 16 && line[..16].eq_ignore_ascii_case(b"x-freqcap-owner:") {
                        self.owner = Some(String::from_utf8_lossy(&line[16..]).trim().to_owned());
                    }
                    if line.len() > 15 && line[..15].eq_ignore_ascii_case(b"content-length:") {
                        len = std::str::from_utf8(&line[15..])?
                            .trim()
                            .parse()
                            .map_err(|_| err("bad content-length"))?;
                    }
                }
                let body = h + 4..h + 4 + len;
                while self.end < body.end {
                    self.fill().await?;
                }
                self.used = body.end;
                return Ok((status, body));
            }
            self.fill().await?;
        }
    }

    async fn http(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Res<(u16, std::ops::Range<usize>)> {
        self.http_with(method, path, "", body, out).await
    }

    /// [`Conn::http`] with `extra` header lines (each ending in `\r\n`).
    async fn http_with(
        &mut self,
        method: &str,
        path: &str,
        extra: &str,
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Res<(u16, std::ops::Range<usize>)> {
        out.clear();
        let _ = write!(
            Wrap(out),
            "{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n",
            body.len()
        );
        out.extend_from_slice(body);
        let req = std::mem::take(out);
        let r = self.send(&req).await;
        *out = req;
        r?;
        self.http_answer().await
    }

    /// Sends one RESP command and reads its reply.
    async fn resp(&mut self, args: &[&[u8]], out: &mut Vec<u8>) -> Res<Resp> {
        out.clear();
        let _ = write!(Wrap(out), "*{}\r\n", args.len());
        for a in args {
            let _ = write!(Wrap(out), "${}\r\n", a.len());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        let req = std::mem::take(out);
        let r = self.send(&req).await;
        *out = req;
        r?;
        loop {
            if let Some((v, n)) = parse_resp(&self.buf[..self.end])? {
                self.used = n;
                return Ok(v);
            }
            self.fill().await?;
        }
    }
}

/// `fmt::Write` into a byte vector.
struct Wrap<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Wrap<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// A reply; the strings are read through `Debug` in error reports.
#[derive(Debug)]
#[allow(dead_code)]
enum Resp {
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Simple(String),
    Error(String),
    Array(Vec<Resp>),
}

/// One complete reply at the front of `b` and its length, or None if more
/// bytes are needed.
fn parse_resp(b: &[u8]) -> Res<Option<(Resp, usize)>> {
    let Some(nl) = find(b, b"\r\n") else {
        return Ok(None);
    };
    if b.is_empty() {
        return Ok(None);
    }
    let line = std::str::from_utf8(&b[1..nl])?;
    let after = nl + 2;
    let int = |s: &str| -> Res<i64> { s.parse::<i64>().map_err(|_| err("bad RESP integer")) };
    Ok(match b[0] {
        b':' => Some((Resp::Int(int(line)?), after)),
        b'+' => Some((Resp::Simple(line.to_owned()), after)),
        b'-' => Some((Resp::Error(line.to_owned()), after)),
        b'$' => {
            let n = int(line)?;
            if n < 0 {
                Some((Resp::Bulk(None), after))
            } else {
                let n = n as usize;
                if b.len() < after + n + 2 {
                    None
                } else {
                    Some((
                        Resp::Bulk(Some(b[after..after + n].to_vec())),
                        after + n + 2,
                    ))
                }
            }
        }
        b'*' => {
            let n = int(line)?;
            let mut items = Vec::new();
            let mut at = after;
            for _ in 0..n.max(0) {
                match parse_resp(&b[at..])? {
                    Some((v, m)) => {
                        items.push(v);
                        at += m;
                    }
                    None => return Ok(None),
                }
            }
            Some((Resp::Array(items), at))
        }
        other => return Err(err(format!("bad RESP type byte {other}"))),
    })
}

// ---- the Lua baseline ----

const LUA_GCRA: &str = include_str!("lua/gcra.lua");
const LUA_SCREEN: &str = include_str!("lua/screen.lua");
const LUA_COMMIT: &str = include_str!("lua/commit.lua");
const LUA_EVENT: &str = include_str!("lua/event.lua");
const LUA_PAY: &str = include_str!("lua/pay.lua");
const LUA_RELEASE: &str = include_str!("lua/release.lua");

struct Shas {
    gcra: String,
    screen: String,
    commit: String,
    event: String,
    pay: String,
    release: String,
}

async fn load_scripts(c: &mut Conn) -> Res<Shas> {
    let mut out = Vec::new();
    let mut load = async |src: &str| -> Res<String> {
        match c
            .resp(&[b"SCRIPT", b"LOAD", src.as_bytes()], &mut out)
            .await?
        {
            Resp::Bulk(Some(s)) => Ok(String::from_utf8(s)?),
            other => Err(err(format!("SCRIPT LOAD: {other:?}"))),
        }
    };
    Ok(Shas {
        gcra: load(LUA_GCRA).await?,
        screen: load(LUA_SCREEN).await?,
        commit: load(LUA_COMMIT).await?,
        event: load(LUA_EVENT).await?,
        pay: load(LUA_PAY).await?,
        release: load(LUA_RELEASE).await?,
    })
}

// ---- Redis Cluster routing, for the Lua recipe on a cluster ----

/// Which primary serves each slot: (first slot, last slot, index in
/// `primaries`).
struct SlotMap {
    primaries: Vec<String>,
    ranges: Vec<(u16, u16, usize)>,
}

impl SlotMap {
    /// The map `CLUSTER SLOTS` of the node at `addr` answers.
    async fn read(addr: &str) -> Res<SlotMap> {
        let mut c = Conn::connect(addr).await?;
        let mut out = Vec::new();
        let Resp::Array(list) = c.resp(&[b"CLUSTER", b"SLOTS"], &mut out).await? else {
            return Err(err("CLUSTER SLOTS: not an array"));
        };
        let mut map = SlotMap {
            primaries: Vec::new(),
            ranges: Vec::new(),
        };
        for r in list {
            let Resp::Array(r) = r else { continue };
            let (Some(Resp::Int(a)), Some(Resp::Int(b)), Some(Resp::Array(node))) =
                (r.first(), r.get(1), r.get(2))
            else {
                return Err(err("CLUSTER SLOTS: unexpected entry"));
            };
            let (Some(Resp::Bulk(Some(ip))), Some(Resp::Int(port))) = (node.first(), node.get(1))
            else {
                return Err(err("CLUSTER SLOTS: unexpected node"));
            };
            let p = format!("{}:{port}", String::from_utf8_lossy(ip));
            let i = match map.primaries.iter().position(|x| *x == p) {
                Some(i) => i,
                None => {
                    map.primaries.push(p);
                    map.primaries.len() - 1
                }
            };
            map.ranges.push((*a as u16, *b as u16, i));
        }
        Ok(map)
    }

    /// The primary (index) serving `key`.
    fn primary(&self, key: &[u8]) -> Res<usize> {
        let s = slot(key);
        self.ranges
            .iter()
            .find(|(a, b, _)| (*a..=*b).contains(&s))
            .map(|r| r.2)
            .ok_or_else(|| err(format!("slot {s} has no primary")))
    }
}

/// Redis Cluster's key slot: CRC16 (XMODEM) of the key's hash tag (what is
/// between the first `{` and the next `}`, if not empty) or of the key.
fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&c| c == b'{').and_then(|s| {
        let rest = &key[s + 1..];
        rest.iter()
            .position(|&c| c == b'}')
            .filter(|&e| e > 0)
            .map(|e| &rest[..e])
    });
    let mut crc: u16 = 0;
    for &b in tagged.unwrap_or(key) {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

// ---- setup: definitions through the API ----

async fn setup_freqcap(addr: &str, k: usize) -> Res<()> {
    let mut c = Conn::connect(addr).await?;
    let mut out = Vec::new();
    let policy = format!(
        r#"{{"limits":[{{"name":"rate","kind":"rate","rate":{RATE},"per":"1s","burst":{BURST}}}]}}"#
    );
    let (st, _) = c
        .http("PUT", "/v1/policies/lg-rate", policy.as_bytes(), &mut out)
        .await?;
    if st != 200 && st != 201 {
        return Err(err(format!("PUT policy: {st}")));
    }
    let camp = format!(
        r#"{{"caps":[{{"name":"daily","kind":"window","limit":{DAILY},"window":"1d","align":"fixed"}},{{"name":"hourly","kind":"window","limit":{ROLLING},"window":"{}ms","align":"rolling"}}],"budget":{{"amount":{BUDGET},"pacing":"asap"}}}}"#,
        ROLLING_MS
    );
    for i in 0..k {
        let path = format!("/v1/campaigns/{}", campaign_name(i));
        let (st, r) = c.http("PUT", &path, camp.as_bytes(), &mut out).await?;
        if st != 200 && st != 201 {
            let b = String::from_utf8_lossy(&c.buf[r]).into_owned();
            return Err(err(format!("PUT campaign: {st} {b}")));
        }
    }
    Ok(())
}

/// Waits (at most 10 s) until node `addr` knows campaign `name`.
async fn wait_for_campaign(addr: &str, name: &str) -> Res<()> {
    let mut c = Conn::connect(addr).await?;
    let mut out = Vec::new();
    for _ in 0..200 {
        let (st, _) = c
            .http("GET", &format!("/v1/campaigns/{name}"), &[], &mut out)
            .await?;
        if st == 200 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(err(format!(
        "{addr} did not apply the definitions within 10 s"
    )))
}

// ---- one run ----

struct Shared {
    a: RunArgs,
    zipf: Option<Zipf>,
    shas: Option<Shas>,
    /// `--target redis-cluster`: who serves which slot.
    slots: Option<SlotMap>,
    /// Each run's users are new (`u<run>-<rank>`), so repeated runs start fresh.
    run_id: String,
    t0: Instant,
    measure_from: Instant,
    end: Instant,
    candidates_json: String,
    /// Owner mode, `--route affinity`: the node each user's owner answered
    /// from (`x-freqcap-owner`), so that its next requests go there, as a
    /// load balancer that learns owners would send them.
    owners: RefCell<std::collections::HashMap<usize, usize>>,
    /// The same candidates, for gRPC's `Screen`.
    candidates: Vec<freqcap::grpc::pb::Candidate>,
    /// `--client-throttle`.
    throttle: Option<Throttle>,
}

/// The client's adaptive throttle (`--client-throttle`).
#[cfg(feature = "client")]
type Throttle = freqcap::client::AdaptiveThrottle;

#[cfg(feature = "client")]
fn throttle(k: f64) -> Res<Option<Throttle>> {
    // The client's window: 2 minutes (docs/clients.md).
    Ok((k > 0.0).then(|| Throttle::new(k, Duration::from_secs(120), 0x7A7E)))
}

#[cfg(not(feature = "client"))]
struct Throttle;

#[cfg(not(feature = "client"))]
impl Throttle {
    fn admit(&self, _: Instant) -> bool {
        true
    }
    fn answered(&self, _: Instant, _: bool) {}
}

#[cfg(not(feature = "client"))]
fn throttle(k: f64) -> Res<Option<Throttle>> {
    if k > 0.0 {
        return Err(err(
            "--client-throttle needs the load generator built with --features client",
        ));
    }
    Ok(None)
}

#[derive(Default)]
struct Tally {
    ops: u64,
    requests: u64,
    errors: u64,
    /// Checks answered 503 `overloaded` (load shedding): counted apart, their
    /// latency in their own histogram, so `p99` is that of accepted requests.
    shed: u64,
    /// Of `ops` and `shed`, those sent as `sheddable`.
    sheddable_ops: u64,
    sheddable_shed: u64,
    /// Rejected by `--client-throttle` without being sent.
    throttled: u64,
    /// Dropped unsent past `--deadline-ms`.
    expired: u64,
    /// Screens with no eligible candidate (no commit follows).
    none_eligible: u64,
    commits: u64,
    denied: u64,
    first_error: Option<String>,
    /// (user rank, campaign index) -> commits, for the accuracy check.
    committed: HashMap<(usize, usize), u64>,
}

async fn run(a: RunArgs) -> Res<()> {
    set_tls(a.tls_ca.as_ref())?;
    let zipf = matches!(a.workload, Workload::Screen | Workload::Events)
        .then(|| Zipf::new(a.users, a.zipf));
    let check = matches!(a.workload, Workload::CheckHot | Workload::Check1m);
    let slots = if a.target == Target::RedisCluster {
        if a.workload != Workload::Screen || a.verify {
            return Err(err("--target redis-cluster runs screen, without --verify"));
        }
        Some(SlotMap::read(&a.addr).await?)
    } else {
        None
    };
    let shas = if a.target == Target::Redis {
        let mut c = Conn::connect(&a.addr).await?;
        Some(load_scripts(&mut c).await?)
    } else if let Some(map) = &slots {
        // Scripts are cached per server: load them on every primary.
        let mut shas = None;
        for p in &map.primaries {
            shas = Some(load_scripts(&mut Conn::connect(p).await?).await?);
        }
        shas
    } else if a.target == Target::FreqcapGrpc && a.workload == Workload::Events {
        return Err(err(
            "--target freqcap-grpc runs check-hot, check-1m and screen",
        ));
    } else if matches!(a.target, Target::FreqcapResp | Target::FreqcapRls) {
        if !check {
            return Err(err(
                "--target freqcap-resp and freqcap-rls run check-hot and check-1m only",
            ));
        }
        // RESP defines nothing; the rate limit service's rules are the
        // server's --rls-config.
        None
    } else {
        setup_freqcap(a.addr_of(0), a.k).await?;
        // Other nodes apply definitions within a second (docs/cluster.md).
        for addr in a.addrs().iter().skip(1) {
            wait_for_campaign(addr, &campaign_name(a.k - 1)).await?;
        }
        None
    };
    let mut candidates_json = String::from("[");
    for i in 0..a.k {
        if i > 0 {
            candidates_json.push(',');
        }
        let _ = write!(candidates_json, r#"{{"campaign":"{}"}}"#, campaign_name(i));
    }
    candidates_json.push(']');
    let run_id = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros()
            % 0xFFFF_FFFF
    );
    let t0 = Instant::now() + Duration::from_millis(50);
    let measure_from = t0 + Duration::from_secs_f64(a.warmup);
    let end = measure_from + Duration::from_secs_f64(a.secs);
    let sh = Rc::new(Shared {
        a: a.clone(),
        zipf,
        shas,
        slots,
        run_id,
        t0,
        measure_from,
        end,
        candidates_json,
        owners: RefCell::default(),
        candidates: (0..a.k)
            .map(|i| freqcap::grpc::pb::Candidate {
                campaign: campaign_name(i),
                cost: None,
            })
            .collect(),
        throttle: throttle(a.client_throttle)?,
    });
    let hist = Rc::new(RefCell::new(Histogram::<u64>::new_with_bounds(
        1_000,
        120_000_000_000,
        3,
    )?));
    let tally = Rc::new(RefCell::new(Tally::default()));
    let shed_hist = Rc::new(RefCell::new(Histogram::<u64>::new_with_bounds(
        1_000,
        120_000_000_000,
        3,
    )?));
    let probe_hist = Rc::new(RefCell::new(Histogram::<u64>::new_with_bounds(
        1_000,
        120_000_000_000,
        3,
    )?));
    let local = tokio::task::LocalSet::new();
    // This process's CPU (and the server's, given its pid) over the measured
    // period, in cores: which side was the bound. With the server's pid,
    // also the user CPU of every other process on the machine (builds,
    // profilers): a run that shared its cores says so.
    let cpu = Rc::new(std::cell::Cell::new(CpuShares::default()));
    {
        let (sh, cpu, pid) = (sh.clone(), cpu.clone(), a.server_pid);
        local.spawn_local(async move {
            tokio::time::sleep_until(sh.measure_from.into()).await;
            let (c0, s0, m0, t0) = (
                cpu_seconds(),
                pid.and_then(pid_cpu_seconds),
                machine_user_seconds(),
                Instant::now(),
            );
            tokio::time::sleep_until(sh.end.into()).await;
            let (c1, s1, m1, t1) = (
                cpu_seconds(),
                pid.and_then(pid_cpu_seconds),
                machine_user_seconds(),
                Instant::now(),
            );
            let dt = t1.duration_since(t0).as_secs_f64();
            let server = s0.zip(s1);
            cpu.set(CpuShares {
                client: Some((c1.0 + c1.1 - c0.0 - c0.1) / dt),
                server: server.map(|(s0, s1)| (s1.0 + s1.1 - s0.0 - s0.1) / dt),
                others: server.zip(m0.zip(m1)).map(|((s0, s1), (m0, m1))| {
                    ((m1 - m0) - (s1.0 - s0.0) - (c1.0 - c0.0)).max(0.0) / dt
                }),
            });
        });
    }
    if a.probe_healthz && a.target == Target::Freqcap {
        let (sh, probe_hist, tally) = (sh.clone(), probe_hist.clone(), tally.clone());
        local.spawn_local(async move {
            if let Err(e) = probe_loop(&sh, &probe_hist).await {
                let mut t = tally.borrow_mut();
                t.errors += 1;
                t.first_error.get_or_insert(format!("healthz probe: {e}"));
            }
        });
    }
    for i in 0..a.conns {
        let (sh, hist, shed_hist, tally) =
            (sh.clone(), hist.clone(), shed_hist.clone(), tally.clone());
        local.spawn_local(async move {
            if let Err(e) = conn_loop(i, &sh, &hist, &shed_hist, &tally).await {
                let mut t = tally.borrow_mut();
                t.errors += 1;
                t.first_error.get_or_insert(e.to_string());
            }
        });
    }
    // Every connection loop ends by `end` (plus one answer's wait); bound it.
    let limit = end + Duration::from_secs(30);
    tokio::time::timeout_at(limit.into(), local).await.ok();
    let wall = a.secs;
    let mut verify = None;
    if a.verify && a.workload == Workload::Screen {
        let committed = std::mem::take(&mut tally.borrow_mut().committed);
        verify = Some(verify_caps(&sh, &committed).await?);
    }
    let h = hist.borrow();
    let t = tally.borrow();
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    let sh_h = shed_hist.borrow();
    let pr_h = probe_hist.borrow();
    let ops_s = t.ops as f64 / wall;
    let CpuShares {
        client: client_cpu,
        server: server_cpu,
        others: others_cpu,
    } = cpu.get();
    if a.json {
        let v = serde_json::json!({
            "target": format!("{:?}", a.target).to_lowercase(),
            "workload": a.workload.to_possible_value().map(|v| v.get_name().to_owned()),
            "tag": a.tag, "nodes": a.addrs().len(), "route": format!("{:?}", a.route).to_lowercase(),
            "conns": a.conns, "rate": a.rate, "secs": a.secs, "k": a.k,
            "ops": t.ops, "ops_per_s": ops_s, "requests_per_s": t.requests as f64 / wall,
            "errors": t.errors, "first_error": t.first_error,
            "commits": t.commits, "none_eligible": t.none_eligible, "denied": t.denied,
            "p50_us": q(0.5), "p90_us": q(0.9), "p99_us": q(0.99), "p999_us": q(0.999),
            "max_us": h.max() as f64 / 1000.0,
            "shed": t.shed, "shed_per_s": t.shed as f64 / wall,
            "shed_share": t.shed as f64 / (t.ops + t.shed).max(1) as f64,
            "shed_p99_us": sh_h.value_at_quantile(0.99) as f64 / 1000.0,
            "sheddable_shed_share":
                t.sheddable_shed as f64 / (t.sheddable_ops + t.sheddable_shed).max(1) as f64,
            "default_shed_share": (t.shed - t.sheddable_shed) as f64
                / (t.ops - t.sheddable_ops + t.shed - t.sheddable_shed).max(1) as f64,
            "throttled": t.throttled, "throttled_per_s": t.throttled as f64 / wall,
            "expired": t.expired, "expired_per_s": t.expired as f64 / wall,
            "healthz_probes": pr_h.len(),
            "healthz_p99_us": pr_h.value_at_quantile(0.99) as f64 / 1000.0,
            "healthz_max_us": pr_h.max() as f64 / 1000.0,
            "verify": verify,
            "client_cpu": client_cpu, "server_cpu": server_cpu, "others_cpu": others_cpu,
            "loadavg": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        });
        println!("{v}");
    } else {
        println!(
            "{:?} {:?} conns={} rate={} : {:.0} ops/s ({:.0} req/s), errors {}, p50 {:.0} µs p90 {:.0} p99 {:.0} p99.9 {:.0} max {:.0}; commits {} none-eligible {} denied {}; cpu client {:.0} % server {} others {}",
            a.target,
            a.workload,
            a.conns,
            a.rate,
            ops_s,
            t.requests as f64 / wall,
            t.errors,
            q(0.5),
            q(0.9),
            q(0.99),
            q(0.999),
            h.max() as f64 / 1000.0,
            t.commits,
            t.none_eligible,
            t.denied,
            client_cpu.unwrap_or(f64::NAN) * 100.0,
            server_cpu.map_or("-".to_owned(), |c| format!("{:.0} %", c * 100.0)),
            others_cpu.map_or("-".to_owned(), |c| format!("{:.0} %", c * 100.0))
        );
        if t.shed > 0 || !pr_h.is_empty() {
            println!(
                "shed (503) {} ({:.1} % of answers), shed p99 {:.0} µs; healthz probes {} p99 {:.0} µs max {:.0} µs",
                t.shed,
                100.0 * t.shed as f64 / (t.ops + t.shed).max(1) as f64,
                sh_h.value_at_quantile(0.99) as f64 / 1000.0,
                pr_h.len(),
                pr_h.value_at_quantile(0.99) as f64 / 1000.0,
                pr_h.max() as f64 / 1000.0
            );
        }
        if let Some(e) = &t.first_error {
            println!("first error: {e}");
        }
        if let Some(v) = verify {
            println!("verify: {v}");
        }
    }
    Ok(())
}

/// `GET /healthz` every 50 ms on its own connection during the measured
/// period; latency from the intended send time.
async fn probe_loop(sh: &Shared, hist: &RefCell<Histogram<u64>>) -> Res<()> {
    let mut c = Conn::connect(sh.a.addr_of(0)).await?;
    let mut out = Vec::with_capacity(512);
    for j in 0..100_000u32 {
        let at = sh.measure_from + Duration::from_millis(50) * j;
        if at >= sh.end {
            break;
        }
        wait_until(at).await;
        let (st, _) = c.http("GET", "/healthz", &[], &mut out).await?;
        if st != 200 {
            return Err(err(format!("healthz answered {st}")));
        }
        let ns = at.elapsed().as_nanos() as u64;
        hist.borrow_mut().saturating_record(ns.max(1_000));
    }
    Ok(())
}

async fn conn_loop(
    i: usize,
    sh: &Shared,
    hist: &RefCell<Histogram<u64>>,
    shed_hist: &RefCell<Histogram<u64>>,
    tally: &RefCell<Tally>,
) -> Res<()> {
    let a = &sh.a;
    let mut c = Conn::connect(a.addr_of(i)).await?;
    let mut grpc = match (a.target, &a.grpc_addr) {
        (Target::FreqcapGrpc | Target::FreqcapRls, Some(g)) => {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://{g}"))?
                .tcp_nodelay(true)
                .connect()
                .await?;
            Some(if a.target == Target::FreqcapRls {
                Rpc::Rls(RateLimitServiceClient::new(ch))
            } else {
                Rpc::Freqcap(FreqcapClient::new(ch))
            })
        }
        (Target::FreqcapGrpc | Target::FreqcapRls, None) => {
            return Err(err(
                "--target freqcap-grpc and freqcap-rls need --grpc-addr",
            ));
        }
        _ => None,
    };
    // `--target redis-cluster`: a connection to every primary.
    let mut primaries = Vec::new();
    for p in sh.slots.iter().flat_map(|m| &m.primaries) {
        primaries.push(Conn::connect(p).await?);
    }
    let mut rng = Rng(0x5EED
        ^ (i as u64).wrapping_mul(0x1234_5678_9ABC_DEF1)
        ^ sh.t0.elapsed().as_nanos() as u64);
    let mut out = Vec::with_capacity(4096);
    let mut body = Vec::with_capacity(4096);
    let interval = (a.rate > 0.0).then(|| Duration::from_secs_f64(a.conns as f64 / a.rate));
    let offset = interval.map(|iv| iv.mul_f64(i as f64 / a.conns as f64));
    let mut seq: u64 = 0;
    // A hard cap on operations per connection besides the clock.
    for j in 0..200_000_000u64 {
        let intended = match (interval, offset) {
            (Some(iv), Some(off)) => {
                let at = sh.t0 + off + iv.mul_f64(j as f64);
                wait_until(at).await;
                at
            }
            _ => Instant::now(),
        };
        if intended >= sh.end {
            break;
        }
        let measured = intended >= sh.measure_from;
        if a.deadline_ms > 0 && intended.elapsed() > Duration::from_millis(a.deadline_ms) {
            tally.borrow_mut().expired += measured as u64;
            continue;
        }
        if let Some(th) = &sh.throttle
            && !th.admit(intended)
        {
            tally.borrow_mut().throttled += measured as u64;
            continue;
        }
        seq += 1;
        let outcome = match (grpc.as_mut(), &sh.slots) {
            (Some(g), _) => grpc_op(sh, g, &mut rng).await,
            (None, Some(map)) => {
                cluster_screen(sh, map, &mut primaries, &mut rng, &mut out, i, seq).await
            }
            (None, None) => {
                if a.fresh_conns && j > 0 {
                    c = Conn::connect(a.addr_of(i)).await?;
                }
                one_op(sh, &mut c, &mut rng, &mut out, &mut body, i, seq).await
            }
        };
        let done = Instant::now();
        let outcome_shed = outcome.as_ref().ok().map(|o| o.shed);
        if let Some(th) = &sh.throttle {
            th.answered(done, outcome_shed == Some(false));
        }
        {
            let mut t = tally.borrow_mut();
            match outcome {
                Ok(o) if o.shed => {
                    if measured {
                        t.shed += 1;
                        t.sheddable_shed += o.sheddable as u64;
                        let ns = done.duration_since(intended).as_nanos() as u64;
                        shed_hist.borrow_mut().saturating_record(ns.max(1_000));
                    }
                }
                Ok(o) => {
                    if measured {
                        t.ops += 1;
                        t.sheddable_ops += o.sheddable as u64;
                        t.requests += o.requests;
                        t.commits += o.committed.is_some() as u64;
                        t.none_eligible += o.none_eligible as u64;
                        t.denied += o.denied as u64;
                        let ns = done.duration_since(intended).as_nanos() as u64;
                        hist.borrow_mut().saturating_record(ns.max(1_000));
                    }
                    if let Some(key) = o.committed {
                        *t.committed.entry(key).or_default() += 1;
                    }
                    if o.error {
                        t.errors += 1;
                        if t.first_error.is_none() {
                            t.first_error =
                                Some(String::from_utf8_lossy(&o.error_body).into_owned());
                        }
                    }
                }
                Err(e) => {
                    t.errors += 1;
                    t.first_error.get_or_insert(e.to_string());
                    return Ok(());
                }
            }
        }
        if outcome_shed == Some(true) && a.honour_retry_after {
            // freqcap's Retry-After on a 503 is always 1 s.
            let until = (done + Duration::from_secs(1)).min(sh.end);
            tokio::time::sleep_until(until.into()).await;
        }
    }
    Ok(())
}

/// Cores used over the measured period.
#[derive(Clone, Copy, Default)]
struct CpuShares {
    client: Option<f64>,
    server: Option<f64>,
    /// User CPU of every other process.
    others: Option<f64>,
}

/// User and system CPU seconds of this process.
fn cpu_seconds() -> (f64, f64) {
    // SAFETY: getrusage writes the struct it is given, nothing else.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (f64::NAN, f64::NAN);
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

fn clock_ticks() -> Option<f64> {
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then_some(hz as f64)
}

/// User and system CPU seconds of process `pid` (all its threads).
fn pid_cpu_seconds(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesized command name; utime and stime are the
    // 14th and 15th fields of the line, the 12th and 13th after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut f = rest.split(' ').skip(11);
    let user: u64 = f.next()?.parse().ok()?;
    let system: u64 = f.next()?.parse().ok()?;
    let hz = clock_ticks()?;
    Some((user as f64 / hz, system as f64 / hz))
}

/// User (and nice) CPU seconds of the whole machine, from /proc/stat.
fn machine_user_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let mut f = stat.lines().next()?.split_whitespace().skip(1);
    let user: u64 = f.next()?.parse().ok()?;
    let nice: u64 = f.next()?.parse().ok()?;
    Some((user + nice) as f64 / clock_ticks()?)
}

/// Sleeps to within a millisecond of `at` (tokio's timer resolution), then
/// yields until it, so sends leave on time rather than on the next tick.
async fn wait_until(at: Instant) {
    let now = Instant::now();
    if at > now + Duration::from_millis(2) {
        tokio::time::sleep_until((at - Duration::from_millis(1)).into()).await;
    }
    for _ in 0..10_000_000u32 {
        if Instant::now() >= at {
            return;
        }
        tokio::task::yield_now().await;
    }
}

#[derive(Default)]
struct Outcome {
    requests: u64,
    committed: Option<(usize, usize)>,
    none_eligible: bool,
    denied: bool,
    /// Answered 503 (load shedding).
    shed: bool,
    /// Sent as `sheddable` (`--sheddable-share`).
    sheddable: bool,
    error: bool,
    error_body: Vec<u8>,
}

/// A gRPC client on one HTTP/2 connection.
enum Rpc {
    Freqcap(FreqcapClient<Channel>),
    Rls(RateLimitServiceClient<Channel>),
}

/// One operation over gRPC: a check (`--target freqcap-grpc`), the same
/// policy and keys as the HTTP check workloads; a screen then a commit, the
/// same campaigns, users and choice of winner as the HTTP screen workload;
/// or a `ShouldRateLimit` of three descriptors (`--target freqcap-rls`).
async fn grpc_op(sh: &Shared, g: &mut Rpc, rng: &mut Rng) -> Res<Outcome> {
    use freqcap::grpc::pb;
    let a = &sh.a;
    let mut o = Outcome {
        requests: 1,
        ..Outcome::default()
    };
    let failed = |o: &mut Outcome, s: tonic::Status| {
        if s.code() == tonic::Code::Unavailable {
            o.shed = true;
        } else {
            o.error = true;
            o.error_body = s.to_string().into_bytes();
        }
    };
    match (g, a.workload) {
        (Rpc::Freqcap(g), Workload::CheckHot | Workload::Check1m) => {
            let key = if a.workload == Workload::CheckHot {
                "hot".to_owned()
            } else {
                format!("k{}", rng.below(a.keys))
            };
            let req = pb::CheckRequest {
                policy: Some("lg-rate".into()),
                key,
                cost: Some(1),
                ..Default::default()
            };
            match g.check(req).await {
                Ok(d) => o.denied = !d.into_inner().allowed,
                Err(s) => failed(&mut o, s),
            }
        }
        (Rpc::Freqcap(g), Workload::Screen) => {
            let zipf = sh.zipf.as_ref().ok_or_else(|| err("no zipf"))?;
            let u = zipf.sample(rng);
            let req = pb::ScreenRequest {
                user: Some(format!("u{}-{u}", sh.run_id)),
                candidates: sh.candidates.clone(),
                // JSON's default; proto3's is false (a dry run).
                reserve: true,
                ..Default::default()
            };
            let ans = match g.screen(req).await {
                Ok(r) => r.into_inner(),
                Err(s) => {
                    // Any failure, a shed one (UNAVAILABLE) included, is an
                    // error, as a non-200 screen is over HTTP.
                    o.error = true;
                    o.error_body = format!("screen: {s}").into_bytes();
                    return Ok(o);
                }
            };
            let eligible: Vec<usize> = ans
                .results
                .iter()
                .enumerate()
                .filter(|(_, r)| r.eligible)
                .map(|(i, _)| i)
                .collect();
            let Some(res) = ans.reservation else {
                o.none_eligible = true;
                return Ok(o);
            };
            if eligible.is_empty() {
                o.none_eligible = true;
                return Ok(o);
            }
            let w = eligible[rng.below(eligible.len() as u64) as usize];
            let req = pb::CommitRequest {
                reservation: res,
                campaign: vec![campaign_name(w)],
                cost: Some(1),
                ..Default::default()
            };
            o.requests = 2;
            match g.commit(req).await {
                Ok(_) => o.committed = Some((u, w)),
                Err(s) => {
                    o.error = true;
                    o.error_body = format!("commit: {s}").into_bytes();
                }
            }
        }
        (Rpc::Rls(g), Workload::CheckHot | Workload::Check1m) => {
            use freqcap::rls::pb::{
                RateLimitDescriptor, RateLimitRequest, rate_limit_descriptor::Entry,
                rate_limit_response::Code,
            };
            let (client, path, tenant) = if a.workload == Workload::CheckHot {
                (0, 0, 0)
            } else {
                (rng.below(a.keys), rng.below(a.keys), rng.below(a.keys))
            };
            let one = |key: &str, value: String| RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.into(),
                    value,
                }],
                ..Default::default()
            };
            let req = RateLimitRequest {
                domain: a.rls_domain.clone(),
                descriptors: vec![
                    one("client", format!("k{client}")),
                    one("path", format!("/api/{path}")),
                    one("tenant", format!("t{tenant}")),
                ],
                hits_addend: 0,
            };
            match g.should_rate_limit(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    if r.overall_code == Code::OverLimit as i32 {
                        o.denied = true;
                    } else if r.overall_code != Code::Ok as i32
                        // One status per descriptor, as rls.proto asks; or
                        // none, as limitador answers (Envoy reads only the
                        // overall code).
                        || !(r.statuses.len() == 3 || r.statuses.is_empty())
                    {
                        o.error = true;
                        o.error_body = format!(
                            "ShouldRateLimit: code {} with {} statuses",
                            r.overall_code,
                            r.statuses.len()
                        )
                        .into_bytes();
                    }
                }
                Err(s) => failed(&mut o, s),
            }
        }
        (_, w) => return Err(err(format!("{:?} does not run {w:?}", a.target))),
    }
    Ok(o)
}

/// `screen.lua` (sha `script`) for `user` over the campaigns `names`, with
/// `key` a key in the user's slot on a cluster (the script builds its keys
/// itself): the eligible candidates' indexes, or the reply if it is not the
/// script's flags.
async fn lua_screen(
    c: &mut Conn,
    script: &str,
    key: Option<&str>,
    user: &str,
    rid: &str,
    names: &[String],
    out: &mut Vec<u8>,
) -> Res<Result<Vec<usize>, String>> {
    let (d, ro, rw, n) = (
        DAILY.to_string(),
        ROLLING.to_string(),
        ROLLING_MS.to_string(),
        names.len().to_string(),
    );
    let mut args: Vec<&[u8]> = vec![b"EVALSHA", script.as_bytes()];
    match key {
        Some(k) => args.extend([&b"1"[..], k.as_bytes()]),
        None => args.push(b"0"),
    }
    args.extend([user, rid, d.as_str(), ro.as_str(), rw.as_str(), n.as_str()].map(str::as_bytes));
    args.extend(names.iter().map(|s| s.as_bytes()));
    Ok(match c.resp(&args, out).await? {
        Resp::Bulk(Some(flags)) => Ok(flags
            .iter()
            .enumerate()
            .filter(|(_, f)| **f == b'1')
            .map(|(i, _)| i)
            .collect()),
        other => Err(format!("{other:?}")),
    })
}

/// One ad request of the Lua recipe on a Redis Cluster: `screen.lua` on the
/// user's primary (every key of it carries the user's hash tag), then
/// `pay.lua` on the winner's budget key and `release.lua` for the holds that
/// did not win, on the user's primary again.
async fn cluster_screen(
    sh: &Shared,
    map: &SlotMap,
    primaries: &mut [Conn],
    rng: &mut Rng,
    out: &mut Vec<u8>,
    conn: usize,
    seq: u64,
) -> Res<Outcome> {
    let a = &sh.a;
    let mut o = Outcome::default();
    let zipf = sh.zipf.as_ref().ok_or_else(|| err("no zipf"))?;
    let shas = sh.shas.as_ref().ok_or_else(|| err("no scripts"))?;
    let u = zipf.sample(rng);
    let user = format!("{{u{}-{u}}}", sh.run_id);
    let user_key = format!("fx:{user}");
    let at = map.primary(user_key.as_bytes())?;
    let rid = format!("r{conn}-{seq}");
    let names: Vec<String> = (0..a.k).map(campaign_name).collect();
    let screened = lua_screen(
        &mut primaries[at],
        &shas.screen,
        Some(&user_key),
        &user,
        &rid,
        &names,
        out,
    )
    .await?;
    o.requests = 1;
    let eligible = match screened {
        Ok(e) => e,
        Err(reply) => {
            o.error = true;
            o.error_body = format!("screen: {reply}").into_bytes();
            return Ok(o);
        }
    };
    if eligible.is_empty() {
        o.none_eligible = true;
        return Ok(o);
    }
    let w = eligible[rng.below(eligible.len() as u64) as usize];
    let budget_key = format!("bud:{}", names[w]);
    let budget = BUDGET.to_string();
    let paid = match primaries[map.primary(budget_key.as_bytes())?]
        .resp(
            &[
                b"EVALSHA",
                shas.pay.as_bytes(),
                b"1",
                budget_key.as_bytes(),
                b"1",
                budget.as_bytes(),
            ],
            out,
        )
        .await?
    {
        Resp::Int(p) => p == 1,
        other => {
            o.error = true;
            o.error_body = format!("pay: {other:?}").into_bytes();
            return Ok(o);
        }
    };
    let mut args: Vec<&[u8]> = vec![
        b"EVALSHA",
        shas.release.as_bytes(),
        b"1",
        user_key.as_bytes(),
        user.as_bytes(),
        rid.as_bytes(),
    ];
    args.extend(
        eligible
            .iter()
            .filter(|&&i| i != w || !paid)
            .map(|&i| names[i].as_bytes()),
    );
    let v = primaries[at].resp(&args, out).await?;
    o.requests = 3;
    match v {
        Resp::Int(_) if paid => o.committed = Some((u, w)),
        Resp::Int(_) => {}
        other => {
            o.error = true;
            o.error_body = format!("release: {other:?}").into_bytes();
        }
    }
    Ok(o)
}

/// The priority header of one HTTP request: `sheddable` for a share
/// `--sheddable-share` of them (noted in `o`), else none (`default`).
fn priority_header(a: &RunArgs, rng: &mut Rng, o: &mut Outcome) -> &'static str {
    o.sheddable =
        a.sheddable_share > 0.0 && (rng.below(1_000_000) as f64) < a.sheddable_share * 1e6;
    if o.sheddable {
        "x-freqcap-priority: sheddable\r\n"
    } else {
        ""
    }
}

async fn one_op(
    sh: &Shared,
    c: &mut Conn,
    rng: &mut Rng,
    out: &mut Vec<u8>,
    body: &mut Vec<u8>,
    conn: usize,
    seq: u64,
) -> Res<Outcome> {
    let a = &sh.a;
    let mut o = Outcome::default();
    body.clear();
    match (a.target, a.workload) {
        (Target::Freqcap, Workload::CheckHot | Workload::Check1m) => {
            if a.workload == Workload::CheckHot {
                body.extend_from_slice(br#"{"policy":"lg-rate","key":"hot"}"#);
            } else {
                let _ = write!(
                    Wrap(body),
                    r#"{{"policy":"lg-rate","key":"k{}"}}"#,
                    rng.below(a.keys)
                );
            }
            let extra = priority_header(a, rng, &mut o);
            let (st, r) = c.http_with("POST", "/v1/check", extra, body, out).await?;
            o.requests = 1;
            o.denied = st == 429;
            o.shed = st == 503;
            if st != 200 && st != 429 && st != 503 {
                o.error = true;
                o.error_body = c.buf[r].to_vec();
            }
        }
        (Target::Redis | Target::FreqcapResp, Workload::CheckHot | Workload::Check1m) => {
            let key = if a.workload == Workload::CheckHot {
                "hot".to_owned()
            } else {
                format!("k{}", rng.below(a.keys))
            };
            let (b, r) = (BURST.to_string(), RATE.to_string());
            let (k, b, r) = (key.as_bytes(), b.as_bytes(), r.as_bytes());
            let v = match &sh.shas {
                Some(shas) => {
                    let sha = shas.gcra.as_bytes();
                    c.resp(&[b"EVALSHA", sha, b"1", k, b, r, b"1", b"1"], out)
                        .await?
                }
                // redis-cell's arguments are the Lua's: key, max_burst,
                // count, period, quantity.
                None => c.resp(&[b"CL.THROTTLE", k, b, r, b"1", b"1"], out).await?,
            };
            o.requests = 1;
            match v {
                Resp::Array(items) => o.denied = matches!(items.first(), Some(Resp::Int(1))),
                other => {
                    o.error = true;
                    o.error_body = format!("{other:?}").into_bytes();
                }
            }
        }
        (Target::FreqcapResp | Target::FreqcapGrpc | Target::FreqcapRls, _) => {
            return Err(err(
                "freqcap-resp, freqcap-grpc and freqcap-rls are not HTTP/1.1 or Redis targets",
            ));
        }
        (Target::Freqcap, Workload::Screen) => {
            let zipf = sh.zipf.as_ref().ok_or_else(|| err("no zipf"))?;
            let mut u = zipf.sample(rng);
            let nodes = a.addrs().len();
            if a.route == Route::Affinity && nodes > 1 {
                // This connection's node serves the users u ≡ conn (mod n),
                // or in owner mode those whose owner it was seen to be:
                // draw again until one is (bounded; n tries on average).
                let owners = sh.owners.borrow();
                for _ in 0..1000 {
                    let node = owners.get(&u).copied().unwrap_or(u % nodes);
                    if node == conn % nodes {
                        break;
                    }
                    u = zipf.sample(rng);
                }
            }
            let _ = write!(
                Wrap(body),
                r#"{{"user":"u{}-{u}","candidates":{}}}"#,
                sh.run_id,
                sh.candidates_json
            );
            let extra = priority_header(a, rng, &mut o);
            let (st, r) = c.http_with("POST", "/v1/screen", extra, body, out).await?;
            if let Some(owner) = c.owner.take()
                && let Some(i) = a.addrs().iter().position(|x| *x == owner)
            {
                sh.owners.borrow_mut().insert(u, i);
            }
            o.requests = 1;
            o.shed = st == 503;
            if st != 200 {
                o.error = !o.shed;
                o.error_body = c.buf[r].to_vec();
                return Ok(o);
            }
            let ans = &c.buf[r];
            let eligible = eligible_of(ans);
            let Some(res) = reservation_of(ans) else {
                o.none_eligible = true;
                return Ok(o);
            };
            if eligible.is_empty() {
                o.none_eligible = true;
                return Ok(o);
            }
            let w = eligible[rng.below(eligible.len() as u64) as usize];
            let path = format!("/v1/reservations/{res}/commit");
            body.clear();
            let _ = write!(
                Wrap(body),
                r#"{{"campaign":"{}","cost":1}}"#,
                campaign_name(w)
            );
            let (st, r) = c.http("POST", &path, body, out).await?;
            o.requests = 2;
            if st == 200 {
                o.committed = Some((u, w));
            } else {
                o.error = true;
                o.error_body = c.buf[r].to_vec();
            }
        }
        (Target::Redis, Workload::Screen) => {
            let zipf = sh.zipf.as_ref().ok_or_else(|| err("no zipf"))?;
            let shas = sh.shas.as_ref().ok_or_else(|| err("no scripts"))?;
            let u = zipf.sample(rng);
            let user = format!("u{}-{u}", sh.run_id);
            let rid = format!("r{conn}-{seq}");
            let names: Vec<String> = (0..a.k).map(campaign_name).collect();
            let screened = lua_screen(c, &shas.screen, None, &user, &rid, &names, out).await?;
            o.requests = 1;
            let eligible = match screened {
                Ok(e) => e,
                Err(reply) => {
                    o.error = true;
                    o.error_body = reply.into_bytes();
                    return Ok(o);
                }
            };
            if eligible.is_empty() {
                o.none_eligible = true;
                return Ok(o);
            }
            let w = eligible[rng.below(eligible.len() as u64) as usize];
            let losers: Vec<&[u8]> = eligible
                .iter()
                .filter(|&&i| i != w)
                .map(|&i| names[i].as_bytes())
                .collect();
            let budget = BUDGET.to_string();
            let mut args: Vec<&[u8]> = vec![
                b"EVALSHA",
                shas.commit.as_bytes(),
                b"0",
                user.as_bytes(),
                rid.as_bytes(),
                names[w].as_bytes(),
                b"1",
                budget.as_bytes(),
            ];
            args.extend(losers);
            let v = c.resp(&args, out).await?;
            o.requests = 2;
            match v {
                Resp::Int(1) => o.committed = Some((u, w)),
                other => {
                    o.error = true;
                    o.error_body = format!("commit: {other:?}").into_bytes();
                }
            }
        }
        (Target::Freqcap, Workload::Events) => {
            let zipf = sh.zipf.as_ref().ok_or_else(|| err("no zipf"))?;
            let u = zipf.sample(rng);
            let camp = rng.below(a.k as u64) as usize;
            let _ = write!(
                Wrap(body),
                r#"{{"user":"u{}-{u}","campaign":"{}","cost":1}}"#,
                sh.run_id,
                campaign_name(camp)
            );
            let (st, r) = c.http("POST", "/v1/events", body, out).await?;
            o.requests = 1;
            if st != 200 {
                o.error = true;
                o.error_body = c.buf[r].to_vec();
            }
        }
        (Target::Redis, Workload::Events) => {
            let zipf = sh.zipf.as_ref().ok_or_else(|| err("no zipf"))?;
            let shas = sh.shas.as_ref().ok_or_else(|| err("no scripts"))?;
            let u = zipf.sample(rng);
            let user = format!("u{}-{u}", sh.run_id);
            let camp = campaign_name(rng.below(a.k as u64) as usize);
            let member = format!("e{conn}-{seq}");
            let (rw, budget) = (ROLLING_MS.to_string(), BUDGET.to_string());
            let v = c
                .resp(
                    &[
                        b"EVALSHA",
                        shas.event.as_bytes(),
                        b"0",
                        user.as_bytes(),
                        camp.as_bytes(),
                        member.as_bytes(),
                        rw.as_bytes(),
                        b"1",
                        budget.as_bytes(),
                    ],
                    out,
                )
                .await?;
            o.requests = 1;
            if !matches!(v, Resp::Int(_)) {
                o.error = true;
                o.error_body = format!("{v:?}").into_bytes();
            }
        }
        (Target::RedisCluster, _) => {
            return Err(err("--target redis-cluster runs through cluster_screen"));
        }
    }
    Ok(o)
}

/// The reservation id of a screen answer, if not null.
fn reservation_of(b: &[u8]) -> Option<&str> {
    let at = find(b, b"\"reservation\":")? + 14;
    let rest = &b[at..];
    if rest.first() != Some(&b'"') {
        return None;
    }
    let end = rest[1..].iter().position(|&c| c == b'"')?;
    std::str::from_utf8(&rest[1..1 + end]).ok()
}

/// Indices of the eligible candidates (results are in candidate order).
fn eligible_of(b: &[u8]) -> Vec<usize> {
    let pat = b"\"eligible\":";
    let mut out = Vec::new();
    let mut at = 0;
    let mut idx = 0;
    while let Some(p) = find(&b[at..], pat) {
        let v = at + p + pat.len();
        if b.get(v) == Some(&b't') {
            out.push(idx);
        }
        idx += 1;
        at = v;
    }
    out
}

/// Reads back every committed (user, campaign): freqcap's usage endpoint, or
/// the Redis keys; no commit may have gone over a cap.
async fn verify_caps(
    sh: &Shared,
    committed: &HashMap<(usize, usize), u64>,
) -> Res<serde_json::Value> {
    let mut c = Conn::connect(sh.a.addr_of(0)).await?;
    let mut out = Vec::new();
    let (mut over_client, mut over_server, mut checked, mut max_seen) = (0u64, 0u64, 0u64, 0u64);
    // Bounded: at most 20 000 pairs read back (the most committed first).
    let mut pairs: Vec<_> = committed.iter().collect();
    pairs.sort_by(|a, b| b.1.cmp(a.1));
    for &(&(u, w), &n) in pairs.iter().take(20_000) {
        max_seen = max_seen.max(n);
        if n > DAILY.min(ROLLING) {
            over_client += 1;
        }
        let user = format!("u{}-{u}", sh.run_id);
        let camp = campaign_name(w);
        let used = match sh.a.target {
            // gRPC's screens are read back over HTTP, on the same server.
            Target::Freqcap | Target::FreqcapGrpc => {
                let path = format!("/v1/users/{user}/campaigns/{camp}");
                let (st, r) = c.http("GET", &path, b"", &mut out).await?;
                if st != 200 {
                    return Err(err(format!("usage: {st}")));
                }
                let v: serde_json::Value = serde_json::from_slice(&c.buf[r])?;
                let mut worst = 0u64;
                for cap in v["caps"].as_array().into_iter().flatten() {
                    let used = cap["used"].as_u64().unwrap_or(0);
                    let limit = cap["limit"].as_u64().unwrap_or(0);
                    if used > limit {
                        over_server += 1;
                    }
                    worst = worst.max(used);
                }
                worst
            }
            Target::FreqcapResp | Target::FreqcapRls | Target::RedisCluster => {
                return Err(err(
                    "no accuracy check over RESP, the rate limit service or a Redis Cluster",
                ));
            }
            Target::Redis => {
                let key = format!("rz:{user}:{camp}");
                match c.resp(&[b"ZCARD", key.as_bytes()], &mut out).await? {
                    Resp::Int(n) => {
                        if n as u64 > ROLLING {
                            over_server += 1;
                        }
                        n as u64
                    }
                    other => return Err(err(format!("ZCARD: {other:?}"))),
                }
            }
        };
        if used < n {
            // The server counts fewer than were acknowledged: lost commits.
            over_server += 1_000_000;
        }
        checked += 1;
    }
    Ok(serde_json::json!({
        "pairs_checked": checked,
        "max_commits_per_pair": max_seen,
        "cap": DAILY.min(ROLLING),
        "pairs_over_cap_by_client_count": over_client,
        "pairs_over_cap_or_lost_by_server": over_server,
    }))
}

// ---- fill: 10M counters through the Engine API ----

fn fill(dir: &std::path::Path, counters: u64) -> Res<()> {
    use freqcap::SystemClock;
    use freqcap::engine::{Engine, EngineOptions, Event};
    use freqcap::store::{Durability, RocksStore};
    let store = Arc::new(RocksStore::open(dir, Durability::Async)?);
    let opts = EngineOptions {
        memory_budget: 256 << 20,
        ..EngineOptions::default()
    };
    let engine = Arc::new(Engine::open(store, SystemClock::new(), opts)?);
    let def = freqcap::model::from_json(
        r#"{"caps":[{"name":"monthly","kind":"window","limit":1000,"window":"30d","align":"fixed"}]}"#,
    )?;
    engine.put_campaign("lg-fill", def)?;
    let start = Instant::now();
    let threads = 2u64;
    let per = counters.div_ceil(threads);
    let mut hs = Vec::new();
    for t in 0..threads {
        let e = engine.clone();
        hs.push(std::thread::spawn(move || -> Res<()> {
            let from = t * per;
            let to = ((t + 1) * per).min(counters);
            let mut i = from;
            while i < to {
                let hi = (i + 1000).min(to);
                let batch: Vec<Event> = (i..hi)
                    .map(|u| Event {
                        user: Some(format!("fill-{u}")),
                        ids: Vec::new(),
                        campaign: "lg-fill".into(),
                        cost: 1,
                        event_id: None,
                        event_type: None,
                    })
                    .collect();
                e.events(&batch)?;
                i = hi;
                if t == 0 && i % 1_000_000 < 1000 {
                    // The hot tier's bytes per record (one counter each), while
                    // the budget has not yet made it drop any.
                    eprintln!(
                        "fill: ~{} counters, {:.1} s, hot tier {} records, {} bytes ({:.1} B/record)",
                        i * threads,
                        start.elapsed().as_secs_f64(),
                        e.hot_len(),
                        e.hot_bytes(),
                        e.hot_bytes() as f64 / e.hot_len().max(1) as f64
                    );
                }
            }
            Ok(())
        }));
    }
    for h in hs {
        h.join().map_err(|_| err("fill thread panicked"))??;
    }
    engine.flush()?;
    println!(
        "filled {counters} counters in {:.1} s; hot tier now {} records, {} bytes",
        start.elapsed().as_secs_f64(),
        engine.hot_len(),
        engine.hot_bytes()
    );
    Ok(())
}

// ---- restart-to-ready ----

fn free_port() -> Res<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn ready(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"GET /readyz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut b = [0u8; 64];
    matches!(s.read(&mut b), Ok(n) if n >= 12 && &b[9..12] == b"200")
}

/// `used` of the fill campaign's cap for `user`, or the answer's first bytes.
fn usage_of(port: u16, user: &str) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return "connect failed".into();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = format!(
        "GET /v1/users/{user}/campaigns/lg-fill HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"
    );
    if s.write_all(req.as_bytes()).is_err() {
        return "write failed".into();
    }
    let mut b = Vec::new();
    let _ = s.take(1 << 16).read_to_end(&mut b);
    let text = String::from_utf8_lossy(&b);
    match text.find("\"used\":") {
        Some(i) => text[i..].chars().take(12).collect(),
        None => text.chars().take(80).collect(),
    }
}

fn restart(bin: &std::path::Path, dir: &std::path::Path, repeat: usize, json: bool) -> Res<()> {
    let mut times = Vec::new();
    for _ in 0..repeat {
        let port = free_port()?;
        let start = Instant::now();
        let mut child = std::process::Command::new(bin)
            .args(["serve", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(dir)
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let mut ok = false;
        // Poll every 0.5 ms, for at most 120 s.
        for _ in 0..240_000 {
            if ready(port) {
                ok = true;
                break;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        let t = start.elapsed().as_secs_f64();
        // The counters are there: three fill users read back (cold reads).
        let mut used = Vec::new();
        if ok {
            for u in [0u64, 4_999_999, 9_999_999] {
                used.push(usage_of(port, &format!("fill-{u}")));
            }
        }
        eprintln!("ready after {t:.3} s; fill users' usage: {used:?}");
        // SIGTERM (graceful), then wait.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait()?;
        if !ok {
            return Err(err("freqcap serve never became ready"));
        }
        times.push(t);
        std::thread::sleep(Duration::from_millis(500));
    }
    if json {
        println!("{}", serde_json::json!({"restart_to_ready_s": times}));
    } else {
        println!("restart to ready (s): {times:?}");
    }
    Ok(())
}
