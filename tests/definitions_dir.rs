//! Definitions as files (docs/service.md, "Definitions as files") on a real
//! `freqcap serve --definitions DIR`: loading at start, read-only through
//! the API, reloads (a watched change, a ConfigMap-style symlink swap,
//! SIGHUP), a bad or partly bad directory kept out whole, counters kept
//! across reloads, a file removed while the service was down, and
//! `freqcap validate DIR`.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::json;

fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    // Written beside and renamed over, as deploy tools do: a poll never
    // reads half a file.
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
}

const POLICY_5: &str =
    r#"{"limits": [{"kind": "window", "limit": 5, "window": "1h", "align": "fixed"}]}"#;

fn serve(dir: &Path, data: &Path) -> support::Stopped {
    support::Stopped(support::serve(
        [
            "--data-dir".as_ref(),
            data.as_os_str(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--definitions".as_ref(),
            dir.as_os_str(),
        ],
        false,
    ))
}

/// Waits (20 s at most) until `f` holds.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("not within 20 s: {what}");
}

fn remaining(s: &support::Stopped, policy: &str, key: &str) -> u64 {
    let (st, v) = support::http(
        &s.addr,
        "POST",
        "/v1/check",
        Some(json!({"policy": policy, "key": key})),
    );
    assert_eq!(st, 200, "{v}");
    v["remaining"].as_u64().unwrap()
}

#[test]
fn files_are_loaded_read_only_and_reloaded_whole() {
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, "policies/api.json", POLICY_5);
    write(
        d,
        "campaigns/brand.toml",
        "caps = [{kind = \"window\", limit = 10, window = \"1d\", align = \"calendar\"}]\n",
    );
    // A parent defined in another file.
    write(
        d,
        "campaigns/spring.json",
        r#"{"parent": "brand", "caps": [{"kind": "window", "limit": 3, "window": "1d", "align": "calendar"}]}"#,
    );
    let s = serve(d, data.path());
    assert_eq!(
        support::http(&s.addr, "GET", "/v1/policies/api", None).0,
        200
    );
    assert_eq!(
        support::http(&s.addr, "GET", "/v1/campaigns/spring", None).0,
        200
    );

    // Read-only through the API: 409 naming the file.
    let (st, v) = support::http(
        &s.addr,
        "PUT",
        "/v1/policies/api",
        Some(serde_json::from_str(POLICY_5).unwrap()),
    );
    assert_eq!(st, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("policies/api.json"),
        "{v}"
    );
    let (st, v) = support::http(&s.addr, "DELETE", "/v1/campaigns/brand", None);
    assert_eq!(st, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("campaigns/brand.toml"),
        "{v}"
    );
    // Others may still be defined through the API.
    assert_eq!(
        support::http(
            &s.addr,
            "PUT",
            "/v1/policies/adhoc",
            Some(serde_json::from_str(POLICY_5).unwrap())
        )
        .0,
        200
    );

    // Counters carry over a reload by item, as over a PUT.
    assert_eq!(remaining(&s, "api", "k"), 4);
    assert_eq!(remaining(&s, "api", "k"), 3);
    write(
        d,
        "policies/api.json",
        r#"{"limits": [{"kind": "window", "limit": 5, "window": "1h", "align": "fixed"},
                       {"kind": "window", "limit": 100, "window": "1d", "align": "fixed"}]}"#,
    );
    eventually("the watched change is applied", || {
        support::http(&s.addr, "GET", "/v1/policies/api", None).1["limits"]
            .as_array()
            .is_some_and(|l| l.len() == 2)
    });
    assert_eq!(remaining(&s, "api", "k"), 2);
    assert_eq!(
        support::metric(&s.addr, "freqcap_definitions_reloads_total").unwrap_or(0.0),
        1.0
    );
    // A raised limit keeps the count too (docs/semantics.md §5.3): 3
    // counted, this one the 4th of 8.
    write(
        d,
        "policies/api.json",
        r#"{"limits": [{"kind": "window", "limit": 8, "window": "1h", "align": "fixed"},
                       {"kind": "window", "limit": 100, "window": "1d", "align": "fixed"}]}"#,
    );
    eventually("the raised limit is applied", || {
        support::http(&s.addr, "GET", "/v1/policies/api", None).1["limits"][0]["limit"] == 8
    });
    assert_eq!(remaining(&s, "api", "k"), 4);

    // A bad file beside a good change: nothing of it is applied.
    write(d, "policies/api.json", POLICY_5);
    write(
        d,
        "campaigns/bad.json",
        r#"{"caps": [{"kind": "window", "limit": 0, "window": "1d"}]}"#,
    );
    eventually("the bad directory is refused", || {
        support::metric(&s.addr, "freqcap_definitions_reload_errors_total").unwrap_or(0.0) == 1.0
    });
    assert_eq!(
        support::http(&s.addr, "GET", "/v1/policies/api", None).1["limits"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    assert_eq!(
        support::http(&s.addr, "GET", "/v1/campaigns/bad", None).0,
        404
    );
    let log = support::log_text(&s.log);
    assert!(log.contains("campaigns/bad.json: caps[0].limit"), "{log}");

    // SIGHUP reloads even when nothing changed: refused once more.
    support::signal(&s.child, libc::SIGHUP);
    eventually("SIGHUP reloads", || {
        support::metric(&s.addr, "freqcap_definitions_reload_errors_total").unwrap_or(0.0) == 2.0
    });

    // Fixed, and a file removed: its definition is deleted.
    std::fs::remove_file(d.join("campaigns/bad.json")).unwrap();
    std::fs::remove_file(d.join("campaigns/spring.json")).unwrap();
    eventually("the fixed directory is applied", || {
        support::http(&s.addr, "GET", "/v1/campaigns/spring", None).0 == 404
    });
    assert_eq!(
        support::http(&s.addr, "GET", "/v1/policies/api", None).1["limits"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    drop(s);

    // A file removed while the service was down is gone after the restart;
    // definitions made through the API stay.
    std::fs::remove_file(d.join("policies/api.json")).unwrap();
    let s = serve(d, data.path());
    assert_eq!(
        support::http(&s.addr, "GET", "/v1/policies/api", None).0,
        404
    );
    assert_eq!(
        support::http(&s.addr, "GET", "/v1/policies/adhoc", None).0,
        200
    );
    assert_eq!(
        support::http(&s.addr, "GET", "/v1/campaigns/brand", None).0,
        200
    );
}

/// A Kubernetes ConfigMap volume: the files are symlinks into `..data`, a
/// symlink to a timestamped directory that an update swaps by a rename.
#[test]
fn a_configmap_style_swap_is_seen() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let r = root.path();
    let v1 = r.join("..2026_11_24_v1");
    write(&v1, "policies/api.json", POLICY_5);
    std::os::unix::fs::symlink("..2026_11_24_v1", r.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/policies", r.join("policies")).unwrap();
    let s = serve(r, data.path());
    assert_eq!(remaining(&s, "api", "k"), 4);
    let v2 = r.join("..2026_11_24_v2");
    write(
        &v2,
        "policies/api.json",
        r#"{"limits": [{"kind": "window", "limit": 9, "window": "1h", "align": "fixed"}]}"#,
    );
    std::os::unix::fs::symlink("..2026_11_24_v2", r.join("..data_tmp")).unwrap();
    std::fs::rename(r.join("..data_tmp"), r.join("..data")).unwrap();
    eventually("the swapped directory is applied", || {
        support::http(&s.addr, "GET", "/v1/policies/api", None).1["limits"][0]["limit"] == 9
    });
}

#[test]
fn a_bad_directory_stops_the_start_and_validate_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, "policies/api.json", POLICY_5);
    write(
        d,
        "campaigns/child.json",
        r#"{"parent": "nowhere", "caps": [{"kind": "window", "limit": 3, "window": "1d"}]}"#,
    );
    let out = Command::new(env!("CARGO_BIN_EXE_freqcap"))
        .args(["serve", "--listen", "127.0.0.1:0", "--grpc-listen", "off"])
        .arg("--data-dir")
        .arg(data.path())
        .arg("--definitions")
        .arg(d)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "definitions: campaigns/child.json: parent: campaign \"nowhere\" does not exist"
        ),
        "{err}"
    );
    let validate = |d: &Path| {
        Command::new(env!("CARGO_BIN_EXE_freqcap"))
            .arg("validate")
            .arg(d)
            .output()
            .unwrap()
    };
    let out = validate(d);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("campaigns/child.json: parent"),
        "{out:?}"
    );
    write(
        d,
        "campaigns/nowhere.toml",
        "caps = [{kind = \"window\", limit = 10, window = \"1d\"}]\n",
    );
    let out = validate(d);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "1 policies, 2 campaigns"
    );
    // Two files for one id.
    write(d, "policies/api.toml", "limits = []\n");
    let out = validate(d);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is also defined by policies/api.json"),
        "{out:?}"
    );
}

/// An entry that is there but cannot be read as a regular file (here a
/// dangling symlink over a live campaign's file) is an error that keeps the
/// previous definitions whole, not a removed file: the campaign and its
/// users' counts stay (case 1.38 of the turn-3 probe).
#[test]
fn an_unreadable_entry_keeps_the_previous_definitions_and_counts() {
    support::away_from_midnight();
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "campaigns/brand.json",
        r#"{"caps": [{"kind": "window", "limit": 10, "window": "1d", "align": "calendar"}]}"#,
    );
    let s = serve(d, data.path());
    let (st, v) = support::http(
        &s.addr,
        "POST",
        "/v1/events",
        Some(json!({"user": "u1", "campaign": "brand"})),
    );
    assert_eq!((st, &v["counted"]), (200, &json!(1)), "{v}");
    let used = || {
        let (st, v) = support::http(&s.addr, "GET", "/v1/users/u1/campaigns/brand", None);
        assert_eq!(st, 200, "the campaign is still defined: {v}");
        v["caps"][0]["used"].clone()
    };
    assert_eq!(used(), 1);

    std::fs::remove_file(d.join("campaigns/brand.json")).unwrap();
    std::os::unix::fs::symlink(d.join("missing.json"), d.join("campaigns/brand.json")).unwrap();
    support::signal(&s.child, libc::SIGHUP);
    let reloads = |name: &str| support::metric(&s.addr, name).unwrap_or(0.0);
    eventually("a reload is tried", || {
        reloads("freqcap_definitions_reloads_total")
            + reloads("freqcap_definitions_reload_errors_total")
            >= 1.0
    });
    assert_eq!(used(), 1);
    assert_eq!(reloads("freqcap_definitions_reloads_total"), 0.0);
    assert_eq!(reloads("freqcap_definitions_reload_errors_total"), 1.0);
    let log = support::log_text(&s.log);
    assert!(
        log.contains("ERROR") && log.contains("campaigns/brand.json"),
        "{log}"
    );

    // Restored: the counts are the ones from before.
    std::fs::remove_file(d.join("campaigns/brand.json")).unwrap();
    write(
        d,
        "campaigns/brand.json",
        r#"{"caps": [{"kind": "window", "limit": 10, "window": "1d", "align": "calendar"}]}"#,
    );
    support::signal(&s.child, libc::SIGHUP);
    eventually("the restored directory is applied", || {
        reloads("freqcap_definitions_reloads_total") >= 1.0
    });
    assert_eq!(used(), 1);
}

/// `freqcap validate DIR` names each kind of entry that is there but is not
/// a readable regular file, and never hangs on a FIFO or /dev/zero.
#[test]
fn validate_names_entries_that_are_not_readable_files() {
    type Make = fn(&Path);
    let cases: [(&str, Make); 5] = [
        ("dangling symlink", |p| {
            std::os::unix::fs::symlink("/nonexistent/x.json", p).unwrap()
        }),
        ("symlink loop", |p| {
            std::os::unix::fs::symlink(p, p).unwrap()
        }),
        ("directory", |p| std::fs::create_dir(p).unwrap()),
        ("/dev/zero", |p| {
            std::os::unix::fs::symlink("/dev/zero", p).unwrap()
        }),
        ("fifo", |p| {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: mkfifo(3) on a NUL-terminated path we own.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        }),
    ];
    for (what, make) in cases {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, "policies/api.json", POLICY_5);
        std::fs::create_dir(d.join("campaigns")).unwrap();
        make(&d.join("campaigns/odd.json"));
        let out = Command::new(env!("CARGO_BIN_EXE_freqcap"))
            .arg("validate")
            .arg(d)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: {out:?}");
        assert!(err.contains("campaigns/odd.json"), "{what}: {err}");
    }
}
