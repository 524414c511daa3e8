//! The Redis Functions library (src/cluster/functions.lua) against a real,
//! throwaway redis-server: compare-and-set, and the lease arithmetic
//! (max-min fairness, idempotence of absolute counters, reclaim after
//! expiry, the total never exceeded over a randomised run). The checks are
//! exact replies, in ops/test-functions.sh, which starts and stops its own
//! server (by PID) on 127.0.0.1:7320.

#[test]
fn the_functions_library_passes_its_checks_against_redis() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ops/test-functions.sh");
    let run = || {
        std::process::Command::new("bash")
            .arg(&script)
            .arg("7320")
            .output()
            .expect("ops/test-functions.sh runs")
    };
    // Two groups of lease calls must land within a 200 ms lease TTL; on a
    // machine loaded by the other tests a group can take longer, which the
    // script reports as such (not as a wrong reply): run it again then, at
    // most twice more. Any other failure fails at once.
    let mut out = run();
    for _ in 0..2 {
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !text.contains("machine too loaded for this timing test") {
            break;
        }
        out = run();
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ops/test-functions.sh failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("all") && stdout.contains("checks passed"),
        "{stdout}"
    );
}
