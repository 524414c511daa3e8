//! Every .proto shipped under `schemas/` compiles with Google's protoc (as
//! grpcio-tools bundles it, tests/requirements.txt), not only with protox,
//! which build.rs uses: Go, Java, Python and C++ users generate their stubs
//! with protoc, and protoc is stricter (an rpc named like a message shadows
//! it inside its service; case 1.52 of the turn-3 probe).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The .proto files under `dir`, relative to it, sorted.
fn protos(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            protos(root, &p, out);
        } else if p.extension().is_some_and(|e| e == "proto") {
            out.push(p.strip_prefix(root).unwrap().to_owned());
        }
    }
}

#[test]
fn every_shipped_proto_compiles_with_protoc() {
    let schemas = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
    let mut files = Vec::new();
    protos(&schemas, &schemas, &mut files);
    // freqcap's own and the vendored Envoy ones.
    assert!(
        files.iter().any(|f| f.starts_with("freqcap"))
            && files.iter().any(|f| f.starts_with("envoy")),
        "{files:?}"
    );

    // Not skipped when grpcio-tools is missing: a missing tool fails here,
    // saying what to install.
    let probe = Command::new("python3")
        .args(["-c", "import grpc_tools.protoc"])
        .output()
        .expect("python3 runs");
    assert!(
        probe.status.success(),
        "grpc_tools is missing: `python3 -m pip install -r tests/requirements.txt` \
         (grpcio-tools); {}",
        String::from_utf8_lossy(&probe.stderr)
    );

    let out_dir = tempfile::tempdir().unwrap();
    // One file at a time, so a failure names it (protoc reads its imports
    // from `-I schemas` either way).
    for f in &files {
        let out = Command::new("python3")
            .args(["-m", "grpc_tools.protoc", "-I"])
            .arg(&schemas)
            .arg(format!("--python_out={}", out_dir.path().display()))
            .arg(format!("--grpc_python_out={}", out_dir.path().display()))
            .arg(f)
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "protoc refuses schemas/{}: {}{}",
            f.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
