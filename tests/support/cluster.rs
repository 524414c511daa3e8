//! A Redis Cluster and freqcap nodes on it, as real processes, for the
//! cluster tests (cluster.rs, owner.rs): a 3-primary + 3-replica cluster
//! started by ops/redis-cluster.sh (which installs Debian's redis-server if
//! missing), nodes on loopback, every process stopped by its PID.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

/// Requests' own timeout: a call into a dead node fails at connect.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The Redis Cluster of this test, stopped (by PID, by the script) on drop.
pub struct Redis {
    pub dir: PathBuf,
    pub seeds: String,
    script: PathBuf,
}

impl Redis {
    pub fn start(dir: &Path, base_port: u16) -> Redis {
        Redis::start_env(dir, base_port, &[])
    }

    /// [`Redis::start`] with the script's environment (a secured cluster:
    /// `REDIS_TLS_DIR`, `REDIS_ACL_USER`, ...).
    pub fn start_env(dir: &Path, base_port: u16, env: &[(&str, &str)]) -> Redis {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("ops/redis-cluster.sh");
        let out = Command::new("bash")
            .envs(env.iter().copied())
            .arg(&script)
            .arg("start")
            .arg(dir)
            .arg(base_port.to_string())
            .output()
            .expect("ops/redis-cluster.sh runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "the cluster did not start: {}\n{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
        let seeds = stdout.lines().last().unwrap_or_default().trim().to_owned();
        assert!(
            seeds.starts_with("redis") && seeds.contains("-cluster://"),
            "{seeds}"
        );
        Redis {
            dir: dir.to_owned(),
            seeds,
            script,
        }
    }

    /// The ports of the current primaries.
    pub fn primaries(&self, base: u16) -> Vec<u16> {
        (base..base + 6)
            .filter(|p| {
                redis_cli(*p, &["role"])
                    .lines()
                    .next()
                    .is_some_and(|l| l.trim() == "master")
            })
            .collect()
    }

    /// The pid of the node on `port` (from the script's pid file).
    pub fn pid(&self, port: u16) -> i32 {
        let pids = std::fs::read_to_string(self.dir.join("pids")).expect("pid file");
        pids.lines()
            .find_map(|l| {
                let (p, pid) = l.split_once(' ')?;
                (p == port.to_string()).then(|| pid.trim().parse().ok())?
            })
            .expect("the port is in the pid file")
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(&self.script)
            .arg("stop")
            .arg(&self.dir)
            .output();
    }
}

/// One redis-server (not a cluster) started with `args` (its port, TLS,
/// users), in `dir`, with nothing persisted; killed by its PID on drop.
pub struct OneRedis(Child);

impl OneRedis {
    /// Starts it and waits (15 s at most) until `redis-cli <cli> PING`
    /// answers PONG.
    pub fn start(dir: &Path, args: &[String], cli: &[String]) -> OneRedis {
        let child = Command::new("redis-server")
            .args(args)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let r = OneRedis(child);
        let started = std::time::Instant::now();
        loop {
            let out = Command::new("redis-cli")
                .args(["-h", "127.0.0.1"])
                .args(cli)
                .arg("PING")
                .output()
                .expect("redis-cli runs");
            if String::from_utf8_lossy(&out.stdout).trim() == "PONG" {
                return r;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "redis-server did not answer"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl OneRedis {
    /// Its process id (to stop and continue it, as a partition does).
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for OneRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-h")
        .arg("127.0.0.1")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One freqcap node; dropping it kills it.
pub struct Node {
    pub child: Child,
    pub base: String,
    pub agent: ureq::Agent,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Node {
    pub fn start(data: &Path, seeds: &str, id: &str) -> Node {
        Node::start_env(data, seeds, id, &[])
    }

    /// [`Node::start`] with environment variables (say, libfaketime's).
    pub fn start_env(data: &Path, seeds: &str, id: &str, env: &[(&str, &str)]) -> Node {
        Node::start_with(data, seeds, id, env, &[])
    }

    /// [`Node::start_env`] with more arguments.
    pub fn start_with(
        data: &Path,
        seeds: &str,
        id: &str,
        env: &[(&str, &str)],
        extra: &[&str],
    ) -> Node {
        let mut args: Vec<&std::ffi::OsStr> =
            ["--listen", "127.0.0.1:0", "--store", seeds, "--node-id", id]
                .into_iter()
                .map(std::ffi::OsStr::new)
                .collect();
        if !extra.contains(&"--durability") {
            // A 3 + 3 cluster's: each write confirmed by a replica. A Redis
            // without replicas (a region's in tests/regions.rs) says its own.
            args.extend(["--durability", "replicated"].map(std::ffi::OsStr::new));
        }
        if !extra.contains(&"--redis-timeout-ms") {
            // Six Redis servers, three nodes and the test share two cores:
            // a replica's WAIT can take longer than the 100 ms default. Still
            // below the 400 ms CLIENT PAUSE, so writes do time out there.
            args.extend(["--redis-timeout-ms", "300"].map(std::ffi::OsStr::new));
        }
        args.push(std::ffi::OsStr::new("--data-dir"));
        args.push(data.as_os_str());
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        let super::Served { child, addr, log } = super::serve_env(args, env, false);
        Node {
            child,
            base: format!("http://{addr}"),
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(REQUEST_TIMEOUT))
                .build()
                .into(),
            log,
        }
    }

    /// [`Node::call`], retried (at most 20 times, 100 ms apart) while it
    /// answers 503, as a client honouring Retry-After would.
    pub fn call_retrying(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut r = self.call(method, path, body);
        for _ in 0..20 {
            if r.0 != 503 {
                break;
            }
            // Shown when a test fails: what was retried, and why.
            eprintln!("{} answered 503 to {method} {path}: {}", self.base, r.1);
            std::thread::sleep(Duration::from_millis(100));
            r = self.call(method, path, body);
        }
        r
    }

    /// (status, body); status 0 when the node cannot be reached.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let r = match (method, body) {
            ("GET", _) => self.agent.get(&url).call(),
            ("DELETE", _) => self.agent.delete(&url).call(),
            ("PUT", Some(b)) => self
                .agent
                .put(&url)
                .header("content-type", "application/json")
                .send(b.to_string()),
            (_, b) => self
                .agent
                .post(&url)
                .header("content-type", "application/json")
                .send(b.map(Value::to_string).unwrap_or_default()),
        };
        match r {
            Ok(mut r) => {
                let status = r.status().as_u16();
                let text = r.body_mut().read_to_string().unwrap_or_default();
                (status, serde_json::from_str(&text).unwrap_or(Value::Null))
            }
            Err(_) => (0, Value::Null),
        }
    }

    /// The first sample of series `name` on its `/metrics`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let url = format!("{}/metrics", self.base);
        let mut r = self.agent.get(&url).call().ok()?;
        let text = r.body_mut().read_to_string().ok()?;
        text.lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `count` nodes named n0, n1, … on `redis`, each with its data under
/// `dir/<name>` and the `extra` arguments (see [`Node::start_with`]).
pub fn nodes(dir: &Path, redis: &Redis, count: usize, extra: &[&str]) -> Vec<Node> {
    (0..count)
        .map(|i| {
            let id = format!("n{i}");
            Node::start_with(&dir.join(&id), &redis.seeds, &id, &[], extra)
        })
        .collect()
}

/// Waits (5 s at most a node) until every node in `nodes` serves the
/// definition at `path`: nodes apply definitions others wrote within a
/// second (docs/cluster.md).
pub fn definition_reached<'a>(nodes: impl IntoIterator<Item = &'a Node>, path: &str) {
    for n in nodes {
        let seen = (0..100).any(|_| {
            n.call("GET", path, None).0 == 200 || {
                std::thread::sleep(Duration::from_millis(50));
                false
            }
        });
        assert!(seen, "{path} did not reach {} within 5 s", n.base);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}
