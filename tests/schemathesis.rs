//! The served OpenAPI document against the server it describes: schemathesis
//! (PyPI, pinned in `tests/requirements.txt`; `make test` installs it)
//! generates requests from `/openapi.json`, valid and invalid, sends them to
//! the real binary (`freqcap serve --memory` on `127.0.0.1:0`), and checks
//! every answer: no 5xx, and status, content type, headers and body as the
//! document declares them.
//!
//! `tests/schemathesis_hooks.py` sends `"wait": true` checks as `false` (the
//! server would sleep up to a policy's `max_delay_ms`).
//!
//! The run is deterministic (`--generation-deterministic`, no example
//! database, one worker) and bounded (`--max-examples` per operation, a
//! time limit past which it is killed). Without schemathesis the test fails
//! and says how to install it; `FREQCAP_SKIP_SCHEMATHESIS=1` skips it instead
//! (for a machine without Python; CI never sets it).

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod support;

/// The whole schemathesis run; it takes 15-30 s on 2 cores.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// Generated cases per operation and phase.
const MAX_EXAMPLES: u32 = 100;

/// The checks run on every answer: no 5xx; status, content type, headers and
/// body as declared; an undeclared method answers 405 with `Allow`; a
/// deleted definition is gone and a created one is there; a request the
/// document forbids is refused (`negative_data_rejection`). Left out:
/// - `positive_data_acceptance`: a valid request may still be refused for
///   what no schema states (an unknown time zone, a parent cycle) or for state
///   (a policy not defined); and serde refuses `1.0` where JSON Schema's
///   `integer` allows it.
/// - the auth checks (the server runs without tokens; `tests/e2e.rs` covers
///   them).
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
                      response_headers_conformance,response_schema_conformance,\
                      unsupported_method,allow_header_conformance,\
                      use_after_free,ensure_resource_availability,negative_data_rejection";

/// Operations not run: `/v1/admin/checkpoint` writes a directory the request
/// names anywhere on the file system (with `--memory` it answers 400, but a
/// generated path must never reach a store that can write).
// /ui/{file} serves scripts and stylesheets (two content types under one
// template); tests/ui.rs drives the page in Chromium instead.
const EXCLUDED_PATHS: &[&str] = &["/v1/admin/checkpoint", "/ui/{file}"];

/// A child process killed (and reaped) when dropped, also when the test fails.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `freqcap serve --listen 127.0.0.1:0 --memory` (its log echoed
/// into the test's output); returns it and its address.
fn start_server() -> (Killed, String) {
    let served = support::serve(["--listen", "127.0.0.1:0", "--memory"], true);
    (Killed(served.child), served.addr)
}

/// The schemathesis version `tests/requirements.txt` pins.
fn pinned_version() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/requirements.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .find_map(|l| l.trim().strip_prefix("schemathesis=="))
        .unwrap_or_else(|| panic!("{} pins no schemathesis version", path.display()))
        .to_owned()
}

/// The command schemathesis installs (also as `st`, a name other programs use).
const SCHEMATHESIS: &str = "schemathesis";

/// `schemathesis --version`'s answer, or `None` when there is none to run.
fn installed_version() -> Option<String> {
    let out = Command::new(SCHEMATHESIS)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "schemathesis, version 4.32.5"
    let v = text.trim().rsplit(' ').next()?.to_owned();
    (out.status.success() && !v.is_empty()).then_some(v)
}

/// Reads a child's output file in full (it is ours; errors read as empty).
fn read_all(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    s
}

#[test]
fn the_served_document_describes_every_answer() {
    let pinned = pinned_version();
    let Some(installed) = installed_version() else {
        if std::env::var_os("FREQCAP_SKIP_SCHEMATHESIS").is_some_and(|v| v == "1") {
            eprintln!("schemathesis is not installed; skipped (FREQCAP_SKIP_SCHEMATHESIS=1)");
            return;
        }
        panic!(
            "schemathesis is not installed (no `schemathesis` on PATH): run `make pydeps` \
             (pip install -r tests/requirements.txt), or set FREQCAP_SKIP_SCHEMATHESIS=1 \
             to skip this test"
        );
    };
    assert_eq!(
        installed, pinned,
        "schemathesis is {installed}, tests/requirements.txt pins {pinned}: run `make pydeps`"
    );

    let (_server, addr) = start_server();
    // The binary must serve the document checked in beside this test: a
    // shared CARGO_TARGET_DIR's binary may have been rebuilt from another
    // checkout (tests/schemas.rs checks the file is this code's).
    let served = ureq::get(format!("http://{addr}/openapi.json"))
        .call()
        .and_then(|mut r| r.body_mut().read_to_string())
        .expect("GET /openapi.json");
    let checked_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/openapi.json");
    assert!(
        std::fs::read_to_string(&checked_in).is_ok_and(|t| t == served),
        "{} does not serve {}: rebuild it (or `make schemas`)",
        env!("CARGO_BIN_EXE_freqcap"),
        checked_in.display()
    );
    let work = tempfile::tempdir().expect("temp dir");
    let (out_path, err_path) = (work.path().join("stdout"), work.path().join("stderr"));
    let hooks = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schemathesis_hooks.py");
    let mut cmd = Command::new(SCHEMATHESIS);
    cmd.arg("run")
        .arg(format!("http://{addr}/openapi.json"))
        .args(["--checks", CHECKS])
        .args(["--max-examples", &MAX_EXAMPLES.to_string()])
        // Same cases on every run, and no example database to replay old
        // failures from (deterministic mode keeps none); one worker, so the
        // order of requests (and with it the server's state) is the same too.
        .arg("--generation-deterministic")
        .args(["--workers", "1"])
        .args(["--request-timeout", "20"])
        .args(["--suppress-health-check", "all"])
        .args(["--no-color", "--output-truncate", "false"])
        .current_dir(work.path())
        .env("SCHEMATHESIS_HOOKS", hooks)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"));
    for path in EXCLUDED_PATHS {
        cmd.args(["--exclude-path", path]);
    }
    let mut st = Killed(cmd.spawn().expect("schemathesis starts"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = st.0.try_wait().expect("schemathesis's status") {
            break Some(status);
        }
        if started.elapsed() > RUN_TIMEOUT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(st);
    let output = format!("{}\n{}", read_all(&out_path), read_all(&err_path));
    println!("{output}");
    match status {
        None => panic!("schemathesis did not finish within {RUN_TIMEOUT:?}; its output:\n{output}"),
        Some(s) => assert!(
            s.success(),
            "schemathesis failed ({s}); its output:\n{output}"
        ),
    }
}
