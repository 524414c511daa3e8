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
    /// `overloaded` (503), `internal` (500); 415 for a body that is not
    /// `application/json`.
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

/// The limits the engine puts on caller-chosen text (docs/service.md): ids
/// are 1 to `max_id_len` bytes (256 by default). JSON Schema counts
/// characters, and a character is at least a byte, so `maxLength` states a
/// bound every accepted id meets (non-ASCII ids reach it sooner).
const MAX_ID_LEN: usize = 256;

/// A key, user or event id, or a reference to a policy or campaign: any
/// text of 1 to 256 bytes (`max_id_len`). A reference outside
/// [`name_schema`] is not refused; it names nothing (404, or an ineligible
/// candidate).
fn id_schema() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": MAX_ID_LEN})
}

/// A policy name or campaign id as `PUT` (and a campaign's `parent`)
/// accepts it: 1–256 of `A-Z a-z 0-9 . _ : -` (and at most `max_id_len`
/// bytes).
fn name_schema() -> Value {
    json!({
        "type": "string", "minLength": 1, "maxLength": MAX_ID_LEN,
        "pattern": format!("^[A-Za-z0-9._:-]{{1,{MAX_ID_LEN}}}$"),
    })
}

/// A reservation id (the engine's `check_reservation_id`): 1–128 of
/// `A-Z a-z 0-9 . _ : -`, the caller's or one the service made.
fn reservation_id_schema() -> Value {
    json!({
        "type": "string", "minLength": 1, "maxLength": 128,
        "pattern": "^[A-Za-z0-9._:-]{1,128}$",
    })
}

fn path_params(method: &str, path: &str) -> Vec<Value> {
    // Only PUT defines a name; other methods look it up.
    let name_or_ref = || {
        if method == "put" {
            name_schema()
        } else {
            id_schema()
        }
    };
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .map(|name| {
            let (schema, what) = match (name, path) {
                ("user", _) => (
                    id_schema(),
                    "The user (1–256 bytes by default: max_id_len).",
                ),
                ("key", _) => (
                    id_schema(),
                    "The key a check names (1–256 bytes by default: max_id_len).",
                ),
                ("kind", _) => (
                    json!({"type": "string", "minLength": 1, "maxLength": 16, "pattern": "^[a-z][a-z0-9_]{0,15}$"}),
                    "The identity kind (user, household, device, ...).",
                ),
                ("ident", _) => (
                    id_schema(),
                    "The identity (1–256 bytes by default: max_id_len).",
                ),
                (_, p) if p.starts_with("/v1/reservations/") => (
                    reservation_id_schema(),
                    "The reservation id (1–128 of A-Z a-z 0-9 . _ : -).",
                ),
                (_, p) if p.starts_with("/v1/policies/") => (
                    name_or_ref(),
                    "The policy name (a defined one is 1–256 of A-Z a-z 0-9 . _ : -).",
                ),
                _ => (
                    name_or_ref(),
                    "The campaign id (a defined one is 1–256 of A-Z a-z 0-9 . _ : -).",
                ),
            };
            json!({
                "name": name, "in": "path", "required": true,
                "description": what, "schema": schema,
            })
        })
        .collect()
}

/// What the derived schemas cannot say, applied to the components by name:
/// the id and name limits the engine checks, the reservation id's alphabet,
/// list lengths, and `/v1/check`'s "exactly one of `policy` and `limits`".
/// Panics if a named schema or property is missing, so a renamed field fails
/// `tests/schemas.rs` rather than silently losing its limits. (The field
/// limits could move to schemars attributes on the body types in `mod.rs`.)
fn refine(schemas: &mut Map<String, Value>) {
    let id = id_schema();
    let name = name_schema();
    let rid = reservation_id_schema();
    let fields: [(&str, &str, &Value); 17] = [
        ("CheckBody", "key", &id),
        ("CheckBody", "policy", &id),
        ("CheckBody", "reservation_id", &rid),
        ("ScreenBody", "user", &id),
        ("ScreenBody", "reservation_id", &rid),
        ("CandidateBody", "campaign", &id),
        ("CommitBody", "user", &id),
        ("CommitBody", "event_id", &id),
        ("EventBody", "user", &id),
        ("EventBody", "campaign", &id),
        ("EventBody", "event_id", &id),
        ("CampaignDef", "parent", &name),
        ("DecisionBody", "reservation", &rid),
        ("ScreenAnswer", "reservation", &rid),
        ("SettledBody", "reservation", &rid),
        ("UsageBody", "user", &id),
        ("UsageBody", "campaign", &name),
    ];
    for (schema, field, limits) in fields {
        let prop = property(schemas, schema, field);
        // String keywords only: a nullable field stays nullable.
        for (k, v) in limits.as_object().into_iter().flatten() {
            if k != "type" {
                prop.insert(k.clone(), v.clone());
            }
        }
    }
    let inline = property(schemas, "CheckBody", "limits");
    inline.insert("minItems".into(), json!(1));
    inline.insert("maxItems".into(), json!(crate::model::limit::MAX_ITEMS));
    let candidates = property(schemas, "ScreenBody", "candidates");
    candidates.insert("minItems".into(), json!(1));
    // max_candidates, by default.
    candidates.insert("maxItems".into(), json!(10_000));
    // `campaign` of a commit: one name or a list of names.
    let one_or_many = component(schemas, "OneOrMany");
    one_or_many["anyOf"][0] = id.clone();
    one_or_many["anyOf"][1]["items"] = id.clone();
    let events = component(schemas, "EventsBody");
    events["anyOf"][1]["minItems"] = json!(1);
    // Exactly one of `policy` and `limits` (null is as good as absent).
    component(schemas, "CheckBody")["oneOf"] = json!([
        {
            "title": "a named policy",
            "required": ["policy"],
            "properties": {"policy": {"type": "string"}, "limits": {"type": "null"}},
        },
        {
            "title": "inline limits",
            "required": ["limits"],
            "properties": {"limits": {"type": "array"}, "policy": {"type": "null"}},
        },
    ]);
}

fn component<'a>(schemas: &'a mut Map<String, Value>, name: &str) -> &'a mut Value {
    schemas
        .get_mut(name)
        .unwrap_or_else(|| panic!("no component schema {name}"))
}

fn property<'a>(
    schemas: &'a mut Map<String, Value>,
    schema: &str,
    field: &str,
) -> &'a mut Map<String, Value> {
    component(schemas, schema)
        .get_mut("properties")
        .and_then(|p| p.get_mut(field))
        .and_then(Value::as_object_mut)
        .unwrap_or_else(|| panic!("{schema} has no property {field}"))
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
            summary: "Define or redefine a named policy; answers the stored definition. Items keep their counts by name across edits (docs/semantics.md §5.3); ?reset=true starts them empty.",
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
            responses: vec![
                (200, "the definition", policy),
                e(400, "the name is over max_id_len bytes"),
                e(404, "no such policy"),
            ],
        },
        Op {
            method: "delete",
            path: "/v1/policies/{name}",
            summary: "Delete a policy and its state.",
            admin: true,
            request: None,
            responses: vec![
                (204, "deleted", None),
                e(400, "the name is over max_id_len bytes"),
                e(404, "no such policy"),
            ],
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
                e(400, "invalid reservation id or body, naming the field"),
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
                e(400, "invalid reservation id, or a body with fields"),
                e(404, "unknown or expired reservation"),
                e(409, "the reservation was committed"),
            ],
        },
        Op {
            method: "put",
            path: "/v1/campaigns/{id}",
            summary: "Define or redefine a campaign (caps, budget, max_in_flight, parent, tz); answers the stored definition. Caps, budget and max_in_flight keep their counts and spend by name across edits (docs/semantics.md §5.3); ?reset=true starts them empty.",
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
                e(400, "the id is over max_id_len bytes"),
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
                e(400, "the id is over max_id_len bytes"),
                e(404, "no such campaign"),
                e(409, "the campaign has children"),
            ],
        },
        Op {
            method: "get",
            path: "/v1/campaigns",
            summary: "Every campaign's id, sorted, and whether it has a budget (the ad-ops page's list).",
            admin: false,
            request: None,
            responses: vec![(200, "campaigns", schema::<CampaignList>(g))],
        },
        Op {
            method: "get",
            path: "/v1/campaigns/{id}/timeline",
            summary: "A campaign's current and previous period minute by minute (spend, commits, cap hits), its pacing line, denials by cap, open reservations and impressions per user against its user cap (docs/semantics.md §7.4).",
            admin: false,
            request: None,
            responses: vec![
                (200, "timeline", schema::<TimelineBody>(g)),
                e(400, "the id is over max_id_len bytes"),
                e(404, "no such campaign"),
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
                e(400, "the id is over max_id_len bytes"),
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
                e(400, "the user or id is over max_id_len bytes"),
                e(404, "no such campaign"),
            ],
        },
        Op {
            method: "get",
            path: "/v1/ids/{kind}/{ident}/campaigns/{id}",
            summary: "Usage of every cap of a campaign and its ancestors scoped to an identity kind (household, device; user too), for one identity, and of the campaign-scope caps.",
            admin: false,
            request: None,
            responses: vec![
                (200, "usage", schema::<IdentityUsageBody>(g)),
                e(
                    400,
                    "the kind is not an identity kind, or the identity or id is over max_id_len bytes",
                ),
                e(404, "no such campaign"),
            ],
        },
        Op {
            method: "post",
            path: "/v1/forecast",
            summary: "Forecast campaigns' delivery per day (impressions, spend, unique users and households, frequency) under all their caps and pacing, on modelled traffic, on a fresh engine and a virtual clock; at most 200 000 requests decided. The service's state is not read or changed.",
            admin: false,
            request: schema::<ForecastBody>(g),
            responses: vec![
                (
                    200,
                    "the forecast",
                    schema::<crate::simulate::forecast::Forecast>(g),
                ),
                e(
                    400,
                    "an invalid field, or a forecast over the size one call decides, naming the field",
                ),
                e(503, "another forecast is running"),
            ],
        },
        Op {
            method: "delete",
            path: "/v1/policies/{name}/keys/{key}",
            summary: "Empty the policy's counters for one key: its next check is decided as a fresh key's; other keys are untouched (docs/semantics.md §5.3). Admin token.",
            admin: true,
            request: None,
            responses: vec![
                (204, "emptied (or it had none)", None),
                e(400, "a key over max_id_len, naming it"),
                e(404, "no policy of that name"),
            ],
        },
        Op {
            method: "delete",
            path: "/v1/users/{user}",
            summary: "Erase a user (right to erasure): every cap counted for them, their open reservations' debits and remembered ids; campaign delivery stays (docs/semantics.md §7.6). Admin token.",
            admin: true,
            request: None,
            responses: vec![
                (204, "erased (or there was nothing)", None),
                e(400, "a user over max_id_len, naming it"),
            ],
        },
        Op {
            method: "delete",
            path: "/v1/ids/{kind}/{ident}",
            summary: "Erase an identity of any kind (a household, a device, ...), as DELETE /v1/users/{user} (docs/semantics.md §7.6). Admin token.",
            admin: true,
            request: None,
            responses: vec![
                (204, "erased (or there was nothing)", None),
                e(
                    400,
                    "a malformed kind or an ident over max_id_len, naming it",
                ),
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
            path: "/ui",
            summary: "The ad-ops page (HTML; static, embedded). Public: its data comes from the API.",
            admin: false,
            request: None,
            responses: vec![(200, "the page", text.clone())],
        },
        Op {
            method: "get",
            path: "/ui/{file}",
            summary: "The page's script, style and chart library (app.js, app.css, uplot.js, uplot.css). Public.",
            admin: false,
            request: None,
            responses: vec![(200, "the file", text.clone()), e(404, "no such file")],
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
            summary: "Readiness: the engine and store are open (with a redis-cluster store: Redis answered within the last 2 s). Public.",
            admin: false,
            request: None,
            responses: vec![
                (200, "ready", text.clone()),
                (
                    503,
                    "not ready: the redis-cluster store has not answered for 2 s",
                    text,
                ),
            ],
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
                        crate::front::metrics::CONTENT_TYPE
                    } else if matches!(op.path, "/healthz" | "/readyz") {
                        "text/plain"
                    } else if op.path == "/ui" {
                        "text/html"
                    } else if op.path == "/ui/{file}" && *status == 200 {
                        // app.js and uplot.js; the stylesheets are text/css.
                        "text/javascript"
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
            for (status, what) in common_errors(op) {
                responses
                    .entry(status.to_string())
                    .or_insert_with(|| json!({"description": what, "content": {"application/json": {"schema": err_ref()}}}));
            }
            let mut o = json!({
                "summary": op.summary,
                "operationId": operation_id(op.method, op.path),
                "responses": responses,
            });
            let mut params = path_params(op.method, op.path);
            if op.method == "put" && matches!(op.path, "/v1/policies/{name}" | "/v1/campaigns/{id}")
            {
                params.push(json!({
                    "name": "reset",
                    "in": "query",
                    "required": false,
                    "description": "true: every counter of the definition starts empty (docs/semantics.md §5.3); by default its items keep their counts by name.",
                    "schema": {"type": "boolean", "default": false},
                }));
                if let Some(ok) = responses.get_mut("200") {
                    ok["headers"] = json!({
                        "Freqcap-Warning": {"description": "One per warning: \"<field>: <message>\" (redundant windows, an item whose kind changed and starts empty).", "schema": {"type": "string"}},
                    });
                }
            }
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
    let mut schemas = g.take_definitions(true);
    refine(&mut schemas);
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
            "schemas": schemas,
            "securitySchemes": {
                "decision": {"type": "http", "scheme": "bearer", "description": "The decision token (--decision-token)."},
                "admin": {"type": "http", "scheme": "bearer", "description": "The admin token (--admin-token)."},
            },
        },
    })
}

/// The errors an operation can answer besides its own: those of the layers
/// every request passes (authentication, load shedding, method routing,
/// body reading) and of the server itself.
fn common_errors(op: &Op) -> Vec<(u16, &'static str)> {
    let mut errors = Vec::new();
    if !super::is_public(op.path) {
        errors.push((401, "missing or wrong bearer token"));
        errors.push((
            503,
            "overloaded: too many requests in flight; see Retry-After",
        ));
    }
    if op.request.is_some() {
        errors.push((
            413,
            "the body is over the size limit (max_body, 1 MiB by default)",
        ));
        errors.push((415, "the body's Content-Type is not application/json"));
    }
    errors.push((405, "the path does not take this method"));
    if !matches!(
        op.path,
        "/healthz" | "/readyz" | "/openapi.json" | "/ui" | "/ui/{file}"
    ) {
        errors.push((500, "internal error: the store failed"));
    }
    errors
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
