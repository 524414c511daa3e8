//! Starting `freqcap serve` as a child process, for the tests that talk to
//! the real binary (e2e.rs, schemathesis.rs, cluster.rs).
//!
//! Each test target uses part of it.
#![allow(dead_code)]

pub mod certs;
pub mod cluster;
pub mod engines;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// How long a server may take to log its address (RocksDB opens first).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Log lines kept per server, for failure messages.
const LOG_LINES: usize = 10_000;

/// A started server: its process (the caller stops it), its address and
/// its log so far.
pub struct Served {
    pub child: Child,
    pub addr: String,
    pub log: Arc<Mutex<Vec<String>>>,
}

/// The log lines kept so far, joined.
pub fn log_text(log: &Mutex<Vec<String>>) -> String {
    log.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
}

/// Starts `freqcap serve <args>` with no `FREQCAP_*` variable of the test's
/// environment (they must not configure the server behind the test's back)
/// and waits until it logs `freqcap listening on 127.0.0.1:PORT`. Its
/// stderr is drained for its whole life (so it never blocks on a full
/// pipe), kept in the log and, with `echo`, copied to the test's output.
pub fn serve<I, S>(args: I, echo: bool) -> Served
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    serve_env(args, &[], echo)
}

/// [`serve`] with environment variables set after the defaults (say,
/// `FREQCAP_LOG`).
pub fn serve_env<I, S>(args: I, env: &[(&str, &str)], echo: bool) -> Served
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_freqcap"));
    cmd.arg("serve").args(&args);
    // Many servers run at once: gRPC's fixed default port only when asked.
    if !args.iter().any(|a| a == "--grpc-listen") {
        cmd.args(["--grpc-listen", "off"]);
    }
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("FREQCAP_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("FREQCAP_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("freqcap serve starts");
    let stderr = child.stderr.take().expect("piped stderr");
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    {
        let log = log.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if echo {
                    eprintln!("server: {line}");
                }
                let addr = tx.as_ref().and_then(|_| listening_addr(&line));
                // Kept before the address is sent: whoever waits for it then
                // finds every line up to this one in the log.
                {
                    let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                    if log.len() < LOG_LINES {
                        log.push(line);
                    }
                }
                if let Some(addr) = addr {
                    let _ = tx.take().map(|t| t.send(addr));
                }
            }
        });
    }
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(addr) => Served { child, addr, log },
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the server did not log its address ({e}); its log:\n{}",
                log_text(&log)
            );
        }
    }
}

/// The address in `... freqcap listening on 127.0.0.1:PORT ...`.
pub fn listening_addr(line: &str) -> Option<String> {
    let rest = line.split("freqcap listening on ").nth(1)?;
    let addr: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect();
    let (_, port) = addr.rsplit_once(':')?;
    (port.parse::<u16>().ok()? != 0).then_some(addr)
}

/// The address a served node logged after `what` (`"gRPC listening on "`,
/// logged before the HTTP address, so it is in the log once [`serve`]
/// returns).
pub fn logged_addr(log: &Mutex<Vec<String>>, what: &str) -> String {
    let text = log_text(log);
    let rest = text
        .lines()
        .find_map(|l| l.split(what).nth(1))
        .unwrap_or_else(|| panic!("the server logs {what:?}; its log:\n{text}"));
    rest.chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect()
}

/// A node in memory on free ports with gRPC on, and its gRPC address.
pub struct GrpcNode {
    pub s: Stopped,
    pub grpc: String,
}

/// Starts a [`GrpcNode`] with `extra` arguments.
pub fn grpc_node(extra: &[&str]) -> GrpcNode {
    let mut args = vec![
        "--memory",
        "--listen",
        "127.0.0.1:0",
        "--grpc-listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let s = Stopped(serve(args, false));
    let grpc = logged_addr(&s.log, "gRPC listening on ");
    GrpcNode { s, grpc }
}

/// A served process, stopped by its PID when the test ends (also when it
/// fails).
pub struct Stopped(pub Served);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.child.kill();
        let _ = self.0.child.wait();
    }
}

impl std::ops::Deref for Stopped {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.0
    }
}

/// One HTTP call to a served node at `addr`: the status (never an error)
/// and the body as JSON, or as a JSON string when it is not JSON.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let url = format!("http://{addr}{path}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = match (method, body) {
        ("PUT", Some(b)) => agent.put(&url).send_json(b),
        ("POST", Some(b)) => agent.post(&url).send_json(b),
        ("DELETE", _) => agent.delete(&url).call(),
        (_, _) => agent.get(&url).call(),
    }
    .expect("HTTP answers");
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap_or_default();
    let v = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, v)
}

/// The value of the sample `series` (`name{labels}`, exactly as exported)
/// in the node's `/metrics`.
pub fn metric(addr: &str, series: &str) -> Option<f64> {
    let (_, v) = http(addr, "GET", "/metrics", None);
    v.as_str()?.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Waits past midnight UTC when it is less than a minute away: a test that
/// counts in daily windows must not see one end half way.
pub fn away_from_midnight() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let left = 86_400 - now % 86_400;
    if left < 60 {
        std::thread::sleep(Duration::from_secs(left + 1));
    }
}

/// Sends `sig` to the served child `child` (not yet reaped, so its pid is
/// still its own): kill(2), no `kill` binary needed.
pub fn signal(child: &Child, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits");
    // SAFETY: kill(2) on our own unreaped child's pid.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
}
