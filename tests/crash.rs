//! An acknowledged commit survives `kill -9` (docs/engine.md, Durability).
//!
//! The test runs this same test binary again as a child process (the ignored
//! test `crash_child`, selected by name), which commits and counts events on
//! RocksDB with `durability = "wal"` from several threads and prints `ack <i>`
//! after each acknowledgement. The parent kills it with SIGKILL at a random
//! point, reopens the data directory, and finds every acknowledged one.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use freqcap::SystemClock;
use freqcap::engine::{
    CommitRequest, Engine, EngineOptions, Event, ScreenCandidate, ScreenRequest,
};
use freqcap::store::{Durability, RocksStore};

const CHILD_DIR: &str = "FREQCAP_CRASH_CHILD_DIR";
const CHILD_ROUND: &str = "FREQCAP_CRASH_CHILD_ROUND";

fn open(dir: &str) -> Engine<SystemClock> {
    let store = Arc::new(RocksStore::open(dir.as_ref(), Durability::Wal).expect("store opens"));
    Engine::open(store, SystemClock::new(), EngineOptions::default()).expect("engine opens")
}

fn user(round: u64, i: u64) -> String {
    format!("r{round}-u{i}")
}

#[test]
#[ignore = "the child process of acknowledged_commits_survive_sigkill"]
fn crash_child() {
    let (Ok(dir), Ok(round)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_ROUND)) else {
        return;
    };
    let round: u64 = round.parse().expect("round is a number");
    let e = open(&dir);
    if e.get_campaign("c").is_none() {
        let def = freqcap::model::from_json(
            r#"{"caps": [{"kind": "window", "limit": 5, "window": "1d", "align": "calendar"}]}"#,
        )
        .expect("valid campaign");
        e.put_campaign("c", def).expect("campaign stored");
    }
    let stdout = std::sync::Mutex::new(std::io::stdout());
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (e, stdout) = (&e, &stdout);
            s.spawn(move || {
                for i in (t..1_000_000).step_by(4) {
                    let u = user(round, i);
                    if i % 2 == 0 {
                        let s = e
                            .screen(&ScreenRequest {
                                priority: Default::default(),
                                user: Some(u),
                                ids: Vec::new(),
                                candidates: vec![ScreenCandidate {
                                    campaign: "c".into(),
                                    cost: None,
                                }],
                                reserve: true,
                                ttl_ms: Some(60_000),
                                reservation_id: None,
                                fingerprint: None,
                            })
                            .expect("screen");
                        let id = s.reservation.expect("a fresh user is eligible");
                        let req = CommitRequest {
                            campaigns: vec!["c".into()],
                            ..CommitRequest::default()
                        };
                        e.commit(&id, &req).expect("commit");
                    } else {
                        let ev = Event {
                            user: Some(u),
                            ids: Vec::new(),
                            campaign: "c".into(),
                            cost: 1,
                            event_id: Some(format!("r{round}-e{i}")),
                            event_type: None,
                        };
                        assert_eq!(e.events(&[ev]).expect("event"), 1);
                    }
                    let mut out = stdout.lock().expect("stdout lock");
                    writeln!(out, "ack {i}").expect("parent reads");
                    out.flush().expect("parent reads");
                }
            });
        }
    });
}

#[test]
fn acknowledged_commits_survive_sigkill() {
    let dir = tempfile::tempdir().expect("temp dir");
    let dir_s = dir.path().to_str().expect("utf-8 path").to_owned();
    let exe = std::env::current_exe().expect("test binary path");
    // A different kill point each round and each run.
    let seed = Instant::now().elapsed().subsec_nanos() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64)
            .unwrap_or(7);
    for round in 0..3u64 {
        let kill_after = 20 + (seed.wrapping_mul(round * 2 + 1) >> 3) % 1500;
        let mut child = Command::new(&exe)
            .args(["crash_child", "--exact", "--ignored", "--nocapture"])
            .env(CHILD_DIR, &dir_s)
            .env(CHILD_ROUND, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("child starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(i) = line.strip_prefix("ack ")
                    && let Ok(i) = i.parse::<u64>()
                    && tx.send(i).is_err()
                {
                    break;
                }
            }
        });
        let mut acked = Vec::new();
        while (acked.len() as u64) < kill_after {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(i) => acked.push(i),
                Err(e) => panic!("child stopped acknowledging after {}: {e}", acked.len()),
            }
        }
        child.kill().expect("SIGKILL");
        child.wait().expect("child reaped");
        // Lines already in the pipe were acknowledged before the kill too.
        acked.extend(rx.iter());
        let _ = reader.join();

        eprintln!(
            "round {round}: killed after {} acknowledgements",
            acked.len()
        );
        let e = open(&dir_s);
        for &i in &acked {
            let u = e.user_usage(&user(round, i), "c").expect("usage");
            assert_eq!(u[0].used, 1, "round {round}: acknowledged {i} was lost");
        }
        // Events acknowledged are remembered as seen.
        for &i in acked.iter().filter(|i| *i % 2 == 1).take(50) {
            let ev = Event {
                user: Some(user(round, i)),
                ids: Vec::new(),
                campaign: "c".into(),
                cost: 1,
                event_id: Some(format!("r{round}-e{i}")),
                event_type: None,
            };
            assert_eq!(
                e.events(&[ev]).expect("event"),
                0,
                "event {i} counted twice"
            );
        }
        drop(e);
    }
}
