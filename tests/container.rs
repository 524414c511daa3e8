//! The container recipe (ops/Dockerfile, ops/k8s/freqcap.yaml), checked as
//! far as a machine without Docker or Kubernetes allows: the Dockerfile
//! builds in two stages and runs as a non-root user; the manifests parse and
//! agree with the image (ports, user, probes, the ConfigMaps' files, Envoy's
//! rate limit cluster and domain); and the binary runs as the image would,
//! with its ENTRYPOINT's flags and the Deployment's arguments, as uid 10001
//! (when the test runs as root), on the ConfigMaps laid out as Kubernetes
//! mounts them (files behind `..data` symlinks), answering its probes.

mod support;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use serde::Deserialize as _;
use serde_yaml_ng::Value;

fn ops(file: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ops").join(file))
        .unwrap_or_else(|e| panic!("ops/{file}: {e}"))
}

/// The Dockerfile's ENTRYPOINT (exec form) and its USER's uid.
fn image() -> (Vec<String>, u32) {
    let text = ops("Dockerfile");
    let line = |word: &str| {
        text.lines()
            .rfind(|l| l.starts_with(word))
            .unwrap_or_else(|| panic!("a {word} line"))
            .trim_start_matches(word)
            .trim()
            .to_owned()
    };
    let entry: Vec<String> =
        serde_json::from_str(&line("ENTRYPOINT")).expect("ENTRYPOINT in exec form");
    let uid: u32 = line("USER")
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("a numeric USER");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("FROM ")).count(),
        2,
        "two stages"
    );
    (entry, uid)
}

/// The manifests' documents, by kind and name.
fn manifests() -> Vec<Value> {
    let text = ops("k8s/freqcap.yaml");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde_yaml_ng::Value::deserialize(d).expect("a YAML document"))
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_image_and_the_manifests_agree() {
    let (entry, uid) = image();
    assert_ne!(uid, 0, "the image runs as a non-root user");
    assert_eq!(entry[1], "serve");
    let flag = |f: &str| {
        entry
            .iter()
            .position(|a| a == f)
            .map(|i| entry[i + 1].clone())
    };
    assert_eq!(flag("--listen").as_deref(), Some("0.0.0.0:8080"));
    assert_eq!(flag("--grpc-listen").as_deref(), Some("0.0.0.0:8081"));

    let docs = manifests();
    let deploy = find(&docs, "Deployment", "freqcap");
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(
        pod["securityContext"]["runAsUser"].as_u64(),
        Some(u64::from(uid))
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    let c = &pod["containers"][0];
    assert_eq!(
        c["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
    assert_eq!(
        c["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    let port = |name: &str| {
        c["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
    };
    assert_eq!(port("http"), Some(8080));
    assert_eq!(port("grpc"), Some(8081));
    // Envoy asks freqcap's service on its gRPC port, for a domain the rules
    // define.
    let envoy: Value = serde_yaml_ng::from_str(
        find(&docs, "ConfigMap", "envoy")["data"]["envoy.yaml"]
            .as_str()
            .unwrap(),
    )
    .expect("envoy.yaml parses");
    let text = serde_yaml_ng::to_string(&envoy).unwrap();
    assert!(text.contains("domain: edge"), "{text}");
    let cluster = envoy["static_resources"]["clusters"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "freqcap")
        .expect("a freqcap cluster");
    let addr = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"];
    assert_eq!(addr["address"].as_str(), Some("freqcap"));
    assert_eq!(addr["port_value"].as_u64(), Some(8081));
    let rules = find(&docs, "ConfigMap", "freqcap-rls")["data"]["edge.yaml"]
        .as_str()
        .unwrap();
    assert!(rules.contains("domain: edge"));
}

/// Lays out a ConfigMap's `files` as Kubernetes mounts one: each file
/// behind the `..data` symlink to a timestamped directory.
fn mount(at: &Path, files: &[(String, String)]) {
    let real = at.join("..2026_12_06_00_00_00.000000000");
    for (path, text) in files {
        let p = real.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
    }
    std::os::unix::fs::symlink(real.file_name().unwrap(), at.join("..data")).unwrap();
    let tops: std::collections::BTreeSet<&str> = files
        .iter()
        .map(|(p, _)| p.split('/').next().unwrap())
        .collect();
    for top in tops {
        std::os::unix::fs::symlink(Path::new("..data").join(top), at.join(top)).unwrap();
    }
}

fn open_to_all(p: &Path) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn the_binary_runs_as_the_image_would() {
    let (entry, uid) = image();
    let docs = manifests();
    let pod = &find(&docs, "Deployment", "freqcap")["spec"]["template"]["spec"];
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    open_to_all(root);
    // The ConfigMaps, at the paths the Deployment mounts them.
    let mounts: Vec<(String, String)> = pod["containers"][0]["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_owned(),
                m["mountPath"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut paths: Vec<(String, PathBuf)> = Vec::new();
    for volume in pod["volumes"].as_sequence().unwrap() {
        let name = volume["name"].as_str().unwrap();
        let (_, mount_path) = mounts.iter().find(|(n, _)| n == name).unwrap();
        let local = root.join(name);
        std::fs::create_dir_all(&local).unwrap();
        open_to_all(&local);
        if let Some(cm) = volume["configMap"]["name"].as_str() {
            let data = &find(&docs, "ConfigMap", cm)["data"];
            let files: Vec<(String, String)> = match volume["configMap"]["items"].as_sequence() {
                Some(items) => items
                    .iter()
                    .map(|i| {
                        let key = i["key"].as_str().unwrap();
                        (
                            i["path"].as_str().unwrap().to_owned(),
                            data[key].as_str().unwrap().to_owned(),
                        )
                    })
                    .collect(),
                None => data
                    .as_mapping()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().unwrap().to_owned(),
                            v.as_str().unwrap().to_owned(),
                        )
                    })
                    .collect(),
            };
            mount(&local, &files);
        }
        paths.push((mount_path.clone(), local));
    }
    // The ENTRYPOINT's flags, then the Deployment's arguments: addresses on
    // loopback (tests listen nowhere else), the mount paths where the test
    // put them.
    let args: Vec<String> = entry[1..]
        .iter()
        .chain(strings(&pod["containers"][0]["args"]).iter())
        .map(|a| {
            if a.starts_with("0.0.0.0:") {
                return "127.0.0.1:0".to_owned();
            }
            for (mount_path, local) in &paths {
                if let Some(rest) = a.strip_prefix(mount_path.as_str()) {
                    return format!("{}{rest}", local.display());
                }
            }
            a.clone()
        })
        .collect();
    // The binary where that user can run it.
    let bin = root.join("freqcap");
    std::fs::copy(env!("CARGO_BIN_EXE_freqcap"), &bin).unwrap();
    open_to_all(&bin);
    let as_root = unsafe { libc::geteuid() } == 0;
    let mut cmd = if as_root {
        for (_, local) in &paths {
            let _ = Command::new("chown")
                .arg("-R")
                .arg(format!("{uid}:{uid}"))
                .arg(local)
                .status();
        }
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid",
            &uid.to_string(),
            "--regid",
            &uid.to_string(),
            "--clear-groups",
        ])
        .arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    cmd.args(&args)
        .env_clear()
        .env("FREQCAP_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = support::Stopped(support::Served {
        child: cmd.spawn().expect("the binary starts"),
        addr: String::new(),
        log: Default::default(),
    });
    let stderr = child.0.child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stderr).lines().take(10_000) {
            let Ok(line) = line else { break };
            if let Some(a) = support::listening_addr(&line) {
                let _ = tx.send(Ok(a));
            }
            lines.push(line);
        }
        let _ = tx.send(Err(lines.join("\n")));
    });
    let addr = match rx.recv_timeout(support::START_TIMEOUT) {
        Ok(Ok(a)) => a,
        other => panic!("not listening with {args:?}: {other:?}"),
    };
    child.0.addr = addr.clone();
    if as_root {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", child.0.child.id())).unwrap();
        let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert!(
            uid_line
                .split_whitespace()
                .all(|f| f == "Uid:" || f == uid.to_string()),
            "{uid_line}"
        );
    }
    for path in [
        "/healthz",
        "/readyz",
        "/v1/policies/api",
        "/v1/campaigns/spring",
    ] {
        let (st, body) = support::http(&addr, "GET", path, None);
        assert_eq!(st, 200, "{path}: {body}");
    }
    // Envoy's rules, from their ConfigMap.
    assert_eq!(support::metric(&addr, "freqcap_rls_rules"), Some(2.0));
}
