//! The JSON Schemas checked in under `schemas/` are the ones the code generates.
//! After changing a definition type, run `make schemas` and commit the result.

use std::path::Path;

#[test]
fn checked_in_schemas_are_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
    for (name, text) in freqcap::model::schemas() {
        let path = dir.join(name);
        let on_disk = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run `make schemas`", path.display()));
        assert!(
            on_disk == text,
            "{} is stale; run `make schemas` and commit it",
            path.display()
        );
    }
}

#[test]
fn schemas_accept_a_documented_example_shape() {
    // The schema is valid JSON and names every kind.
    let (_, limit) = &freqcap::model::schemas()[0];
    let v: serde_json::Value = serde_json::from_str(limit).unwrap();
    let kinds: Vec<_> = v["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s["properties"]["kind"]["const"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(kinds, ["rate", "gap", "window", "budget", "concurrency"]);
}
