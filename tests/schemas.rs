//! The JSON Schemas checked in under `schemas/` are the ones the code generates.
//! After changing a definition type, run `make schemas` and commit the result.

use std::path::Path;

#[test]
fn checked_in_schemas_are_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
    let openapi = ("openapi.json", freqcap::api::openapi::document_text());
    for (name, text) in freqcap::model::schemas().into_iter().chain([openapi]) {
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
    assert_eq!(
        kinds,
        ["rate", "gap", "window", "budget", "concurrency", "adaptive"]
    );
}

#[test]
fn openapi_lists_every_route_with_its_bodies() {
    let doc = freqcap::api::openapi::document();
    assert_eq!(doc["openapi"], "3.1.0");
    for route in freqcap::api::ROUTES {
        let item = &doc["paths"][route];
        assert!(
            item.as_object().is_some_and(|o| !o.is_empty()),
            "{route} has no operations"
        );
    }
    // Request and answer bodies resolve to schemas made from the handlers' types.
    let check = &doc["paths"]["/v1/check"]["post"];
    let req = check["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        .as_str()
        .unwrap();
    let name = req.rsplit('/').next().unwrap();
    let props = &doc["components"]["schemas"][name]["properties"];
    for field in [
        "policy",
        "limits",
        "key",
        "cost",
        "reserve",
        "ttl_ms",
        "reservation_id",
        "wait",
    ] {
        assert!(props.get(field).is_some(), "CheckBody lacks {field}");
    }
    assert!(check["responses"]["429"]["headers"]["Retry-After"].is_object());
    // Every $ref points at a schema that exists.
    let text = doc.to_string();
    for piece in text.split("\"$ref\":\"").skip(1) {
        let target = piece.split('"').next().unwrap();
        let name = target.strip_prefix("#/components/schemas/").unwrap();
        assert!(
            doc["components"]["schemas"].get(name).is_some(),
            "dangling $ref {target}"
        );
    }
}

#[test]
fn openapi_declares_every_error_and_limit() {
    let doc = freqcap::api::openapi::document();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            let has = |s: &str| responses.contains_key(s);
            let what = format!("{method} {path}");
            assert!(has("405"), "{what} lacks 405");
            if path.starts_with("/v1/") {
                for s in ["401", "500", "503"] {
                    assert!(has(s), "{what} lacks {s}");
                }
                // Input that can be wrong: a path parameter or a body.
                if op.get("parameters").is_some() || op.get("requestBody").is_some() {
                    assert!(has("400"), "{what} lacks 400");
                }
            }
            if op.get("requestBody").is_some() {
                assert!(has("413") && has("415"), "{what} lacks 413 or 415");
            }
            // Path parameters carry the engine's limits.
            let params = op["parameters"].as_array().into_iter().flatten();
            for p in params.filter(|p| p["in"] == "path") {
                let max = p["schema"]["maxLength"].as_u64();
                assert!(
                    p["schema"]["minLength"] == 1 && max.is_some_and(|m| m <= 256),
                    "{what}: {} has no length limits",
                    p["name"]
                );
            }
        }
    }
    let schemas = &doc["components"]["schemas"];
    let rid = "^[A-Za-z0-9._:-]{1,128}$";
    assert_eq!(
        schemas["CheckBody"]["properties"]["reservation_id"]["pattern"],
        rid
    );
    assert_eq!(
        schemas["ScreenBody"]["properties"]["reservation_id"]["pattern"],
        rid
    );
    let commit = &doc["paths"]["/v1/reservations/{id}/commit"]["post"];
    assert_eq!(commit["parameters"][0]["schema"]["pattern"], rid);
    assert_eq!(schemas["CheckBody"]["properties"]["key"]["maxLength"], 256);
    // Exactly one of policy and limits.
    let one_of = schemas["CheckBody"]["oneOf"].as_array().unwrap();
    let required: Vec<_> = one_of.iter().map(|s| s["required"][0].clone()).collect();
    assert_eq!(required, ["policy", "limits"]);
}
