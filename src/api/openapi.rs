//! The OpenAPI 3.1 document of the HTTP API, made from the code: every body's
//! schema is derived (schemars) from the very types the handlers read and
//! write, and the paths come from [`super::ROUTES`] order. `schemas/openapi.json`
//! is this document; `tests/schemas.rs` fails when the file is stale
//! (`make schemas` rewrites it). Served at `/openapi.json`.

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Map, Value, json};

use super::*;
use crate::model::{CampaignDef, PolicyDef};

/// The error body of every endpoint (`{"error": {"code", "message"}}`).
#[derive(JsonSchema)]
#[allow(dead_code)] // Only its schema is used; `error.rs` writes the body.
struct ErrorBody {
    error: ErrorInner,
}

#[derive(JsonSchema)]
#[allow(dead_code)]
struct ErrorInner {
    /// `invalid_argument` (400), `unauthenticated` (401), `not_found` (404),
    /// `method_not_allowed` (405), `conflict` (409), `too_large` (413),
    /// `overloaded` (503), `internal` (500).
    code: String,
    /// What is wrong; for 400, it starts with the offending field
    /// (`candidates[2].cost: ...`).
    message: String,
}

/// One event, or a batch of them (applied all or nothing).
#[derive(JsonSchema)]
#[allow(dead_code)]
#[serde(untagged)]
enum EventsBody {
    One(EventBody),
    Many(Vec<EventBody>),
}

/// How an operation reads and answers.
struct Op {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    /// The admin token (definitions, operations) rather than the decision one.
    admin: bool,
    request: Option<Value>,
    /// (status, description, body schema).
    responses: Vec<(u16, &'static str, Option<Value>)>,
}

fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Option<Value> {
    Some(g.subschema_for::<T>().to_value())
}

fn path_params(path: &str) -> Vec<Value> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .map(|name| {
            json!({
                "name": name, "in": "path", "required": true,
                "schema": {"type": "string", "minLength": 1, "maxLength": 256}
            })
        })
        .collect()
}

fn operations(g: &mut SchemaGenerator) -> Vec<Op> {
    let err = schema::<ErrorBody>(g);
    let e = |code: u16, what: &'static str| (code, what, err.clone());
    let decision = schema::<DecisionBody>(g);
    let settled = schema::<SettledBody>(g);
    let policy = schema::<PolicyDef>(g);
    let campaign = schema::<CampaignDef>(g);
    let text = Some(json!({"type": "string"}));
    vec![
        Op {
            method: "put",
            path: "/v1/policies/{name}",
            summary: "Define or redefine a named policy; answers the stored definition. Items whose definition is unchanged at the same index keep their state.",
            admin: true,
            request: policy.clone(),
            responses: vec![
                (200, "stored", policy.clone()),
                e(400, "invalid definition, naming the field"),
            ],
        },
        Op {
            method: "get",
            path: "/v1/policies/{name}",
            summary: "Read a policy definition (either token).",
            admin: false,
            request: None,
            responses: vec![(200, "the definition", policy), e(404, "no such policy")],
        },
        Op {
            method: "delete",
            path: "/v1/policies/{name}",
            summary: "Delete a policy and its state.",
            admin: true,
            request: None,
            responses: vec![(204, "deleted", None), e(404, "no such policy")],
        },
        Op {
            method: "post",
            path: "/v1/check",
            summary: "Decide (and optionally reserve) `cost` units for `key` against a named policy or inline limits. 200 when allowed, 429 when denied, with RateLimit-Policy and RateLimit header fields (IETF draft-10) and Retry-After (seconds) on 429.",
            admin: false,
            request: schema::<CheckBody>(g),
            responses: vec![
                (
                    200,
                    "allowed (possibly delayed: see delay_ms)",
                    decision.clone(),
                ),
                (429, "denied; nothing was debited", decision),
                e(400, "invalid request, naming the field"),
                e(404, "no such policy"),
                e(
                    409,
                    "reservation_id is live with a different body, or was settled",
                ),
            ],
        },
        Op {
            method: "post",
            path: "/v1/reservations/{id}/commit",
            summary: "Make a reservation's pending debits permanent, optionally at a final cost; with a screen's reservation, name the winning campaign(s) and the rest are released. An unknown or expired id with user, campaign and cost is a late commit. Durable before it answers.",
            admin: false,
            request: schema::<CommitBody>(g),
            responses: vec![
                (
                    200,
                    "committed (or the first outcome of a repeated commit)",
                    settled.clone(),
                ),
                e(400, "invalid request"),
                e(404, "unknown or expired reservation, or unknown campaign"),
                e(409, "the reservation was released"),
            ],
        },
        Op {
            method: "post",
            path: "/v1/reservations/{id}/release",
            summary: "Undo a reservation's pending debits.",
            admin: false,
            request: schema::<ReleaseBody>(g),
            responses: vec![
                (
                    200,
                    "released (or the first outcome of a repeated release)",
                    settled,
                ),
                e(404, "unknown or expired reservation"),
                e(409, "the reservation was committed"),
            ],
        },
        Op {
            method: "put",
            path: "/v1/campaigns/{id}",
            summary: "Define or redefine a campaign (caps, budget, max_in_flight, parent, tz); answers the stored definition.",
            admin: true,
            request: campaign.clone(),
            responses: vec![
                (200, "stored", campaign.clone()),
                e(
                    400,
                    "invalid definition, unknown parent or a parent cycle, naming the field",
                ),
            ],
        },
        Op {
            method: "get",
            path: "/v1/campaigns/{id}",
            summary: "Read a campaign definition.",
            admin: false,
            request: None,
            responses: vec![
                (200, "the definition", campaign),
                e(404, "no such campaign"),
            ],
        },
        Op {
            method: "delete",
            path: "/v1/campaigns/{id}",
            summary: "Delete a campaign and its counters.",
            admin: true,
            request: None,
            responses: vec![
                (204, "deleted", None),
                e(404, "no such campaign"),
                e(409, "the campaign has children"),
            ],
        },
        Op {
            method: "get",
            path: "/v1/campaigns/{id}/delivery",
            summary: "A campaign's budget now: amount, spent, pending, the paced cap and the period.",
            admin: false,
            request: None,
            responses: vec![
                (200, "delivery", schema::<DeliveryBody>(g)),
                e(404, "no such campaign, or it has no budget"),
            ],
        },
        Op {
            method: "post",
            path: "/v1/screen",
            summary: "Screen candidate campaigns for a user in order; each is all-or-nothing over its chain. With reserve (the default) every eligible candidate holds a pending debit under one reservation.",
            admin: false,
            request: schema::<ScreenBody>(g),
            responses: vec![
                (
                    200,
                    "one result per candidate, in order",
                    schema::<ScreenAnswer>(g),
                ),
                e(400, "invalid request, naming the field"),
                e(
                    409,
                    "reservation_id is live with a different body, or was settled",
                ),
            ],
        },
        Op {
            method: "post",
            path: "/v1/events",
            summary: "Count impressions that happened without a reservation; idempotent by event_id within the dedupe horizon. A batch applies nothing unless every event is valid.",
            admin: false,
            request: schema::<EventsBody>(g),
            responses: vec![
                (200, "counted", schema::<EventsAnswer>(g)),
                e(400, "invalid event, naming [index].field"),
                e(404, "unknown campaign"),
            ],
        },
        Op {
            method: "get",
            path: "/v1/users/{user}/campaigns/{id}",
            summary: "Usage of every cap of a campaign and its ancestors for a user.",
            admin: false,
            request: None,
            responses: vec![
                (200, "usage", schema::<UsageBody>(g)),
                e(404, "no such campaign"),
            ],
        },
        Op {
            method: "post",
            path: "/v1/admin/checkpoint",
            summary: "Write a consistent copy of the data directory (a RocksDB checkpoint) into a new directory, for backups.",
            admin: true,
            request: schema::<CheckpointBody>(g),
            responses: vec![
                (200, "written", schema::<CheckpointBody>(g)),
                e(400, "no directory named, or the service runs in memory"),
                e(409, "the directory exists"),
            ],
        },
        Op {
            method: "get",
            path: "/metrics",
            summary: "Prometheus / OpenMetrics text. Public.",
            admin: false,
            request: None,
            responses: vec![(200, "metrics", text.clone())],
        },
        Op {
            method: "get",
            path: "/healthz",
            summary: "Liveness: the process answers. Public.",
            admin: false,
            request: None,
            responses: vec![(200, "ok", text.clone())],
        },
        Op {
            method: "get",
            path: "/readyz",
            summary: "Readiness: the engine and store are open. Public.",
            admin: false,
            request: None,
            responses: vec![(200, "ready", text)],
        },
        Op {
            method: "get",
            path: "/openapi.json",
            summary: "This document. Public.",
            admin: false,
            request: None,
            responses: vec![(200, "the OpenAPI document", Some(json!({"type": "object"})))],
        },
    ]
}

/// The document as a JSON value.
pub fn document() -> Value {
    let settings = SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = "/components/schemas".into();
        s.meta_schema = None;
    });
    let mut g = settings.into_generator();
    let ops = operations(&mut g);
    let mut paths = Map::new();
    for route in super::ROUTES {
        let mut item = Map::new();
        for op in ops.iter().filter(|o| o.path == *route) {
            let mut responses = Map::new();
            for (status, what, body) in &op.responses {
                let mut r = json!({"description": what});
                if let Some(b) = body {
                    let media = if op.path == "/metrics" {
                        super::metrics::CONTENT_TYPE
                    } else if matches!(op.path, "/healthz" | "/readyz") {
                        "text/plain"
                    } else {
                        "application/json"
                    };
                    r["content"] = json!({ media: {"schema": b} });
                }
                if op.path == "/v1/check" && (*status == 200 || *status == 429) {
                    r["headers"] = json!({
                        "RateLimit-Policy": {"description": "Every item: \"name\";q=limit;w=window seconds (concurrency: qu=\"concurrent-requests\").", "schema": {"type": "string"}},
                        "RateLimit": {"description": "The item with the least remaining: \"name\";r=remaining;t=seconds until full.", "schema": {"type": "string"}},
                    });
                    if *status == 429 {
                        r["headers"]["Retry-After"] = json!({"description": "Seconds until the same request could pass; absent when it never can.", "schema": {"type": "integer"}});
                    }
                }
                responses.insert(status.to_string(), r);
            }
            if !super::is_public(op.path) {
                responses.insert("401".into(), json!({"description": "missing or wrong bearer token", "content": {"application/json": {"schema": err_ref()}}}));
                responses.insert("503".into(), json!({"description": "overloaded: too many requests in flight; see Retry-After", "content": {"application/json": {"schema": err_ref()}}}));
            }
            let mut o = json!({
                "summary": op.summary,
                "operationId": operation_id(op.method, op.path),
                "responses": responses,
            });
            let params = path_params(op.path);
            if !params.is_empty() {
                o["parameters"] = Value::Array(params);
            }
            if let Some(b) = &op.request {
                let optional = matches!(
                    op.path,
                    "/v1/reservations/{id}/commit" | "/v1/reservations/{id}/release"
                );
                o["requestBody"] = json!({
                    "required": !optional,
                    "content": {"application/json": {"schema": b}},
                });
            }
            if !super::is_public(op.path) {
                o["security"] = json!([{ if op.admin { "admin" } else { "decision" }: [] }, {}]);
            }
            item.insert(op.method.into(), o);
        }
        paths.insert((*route).into(), Value::Object(item));
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "freqcap",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Frequency capping and rate limiting: exact limits, stacked decisions, reservations. Durations are strings like \"250ms\", \"1s\", \"5m\", \"1h\", \"1d\", \"1w\" (\"1mo\" for calendar windows and budgets); reported *_ms values are whole milliseconds rounded up. Bearer tokens are optional: when the service sets them, decision endpoints need the decision token and definition/admin endpoints the admin token (the empty security requirement means: open when no token is configured).",
        },
        "servers": [{"url": "http://127.0.0.1:8080"}],
        "paths": paths,
        "components": {
            "schemas": g.take_definitions(true),
            "securitySchemes": {
                "decision": {"type": "http", "scheme": "bearer", "description": "The decision token (--decision-token)."},
                "admin": {"type": "http", "scheme": "bearer", "description": "The admin token (--admin-token)."},
            },
        },
    })
}

fn err_ref() -> Value {
    json!({"$ref": "#/components/schemas/ErrorBody"})
}

/// `put_v1_policies_name`, say: unique per (method, path).
fn operation_id(method: &str, path: &str) -> String {
    let mut id = method.to_owned();
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        id.push('_');
        id.extend(
            seg.chars()
                .filter(|c| *c != '{' && *c != '}')
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }),
        );
    }
    id
}

/// The document as the text of `schemas/openapi.json`.
pub fn document_text() -> String {
    let mut text = serde_json::to_string_pretty(&document()).unwrap_or_default();
    text.push('\n');
    text
}
