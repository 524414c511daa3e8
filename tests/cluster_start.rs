//! Starting `freqcap serve` on a Redis store with a configuration it cannot
//! serve: a one-line error and a non-zero exit, never a panic (issue 25,
//! "fail well"). One Debian `redis-server` on a free loopback port, stopped
//! by its PID.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A redis-server child, killed by its PID when dropped.
struct Redis(Child, u16);

impl Redis {
    fn start() -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs (make deps installs it)");
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < until, "redis-server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Redis(child, port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `freqcap serve <args>` to its exit (30 s at most): its status and
/// stderr.
fn serve_to_exit(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_freqcap"))
        .arg("serve")
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("freqcap runs");
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("freqcap serve did not exit within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    use std::io::Read;
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    (status, err)
}

/// An error found after the redis-cluster store is open (here a bad
/// `--rls-config` rule): d5eefae panicked ("Cannot drop a runtime in a
/// context where blocking is not allowed") while returning its error (then
/// with any rules: the service was refused with a cluster store).
#[test]
fn a_start_up_error_with_a_redis_store_is_one_line_not_a_panic() {
    let redis = Redis::start();
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(
        rules.path().join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: path\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n",
    )
    .unwrap();
    let store = format!("redis-cluster://127.0.0.1:{}", redis.1);
    let (status, err) = serve_to_exit(&[
        "--store",
        &store,
        "--listen",
        "127.0.0.1:0",
        "--grpc-listen",
        "127.0.0.1:0",
        "--rls-config",
        rules.path().to_str().unwrap(),
    ]);
    assert!(!status.success(), "{status:?}\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("rls_config:"), "names the option: {err}");
    assert!(err.contains("fortnight"), "names the value: {err}");
}
