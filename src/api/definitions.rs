//! `PUT`/`GET`/`DELETE /v1/policies/{name}` and `/v1/campaigns/{id}`: one
//! set of handlers for both kinds of definition.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::St;
use super::request::*;
use crate::clock::Clock;
use crate::engine::{Engine, EngineError};
use crate::front::FrontError;
use crate::front::call::*;
use crate::model::{CampaignDef, PolicyDef, Warning};

/// Policies and campaigns are stored, read and deleted alike; one set of
/// handlers serves both.
pub(crate) trait Definition: Serialize + DeserializeOwned + Clone + Send + 'static {
    /// The path parameter naming it, for errors.
    const PARAM: &'static str;
    /// What it is, for "no policy named ..." errors.
    const WHAT: &'static str;
    /// Stores it; `fresh`: its counters start empty (`?reset=true`).
    fn put<C: Clock>(
        e: &Engine<C>,
        name: &str,
        def: Self,
        fresh: bool,
    ) -> Result<Vec<Warning>, EngineError>;
    fn get<C: Clock>(e: &Engine<C>, name: &str) -> Option<Self>;
    fn delete<C: Clock>(e: &Engine<C>, name: &str) -> Result<(), EngineError>;
}

impl Definition for PolicyDef {
    const PARAM: &'static str = "name";
    const WHAT: &'static str = "policy";
    fn put<C: Clock>(
        e: &Engine<C>,
        name: &str,
        def: Self,
        fresh: bool,
    ) -> Result<Vec<Warning>, EngineError> {
        e.put_policy_as(name, def, fresh)
    }
    fn get<C: Clock>(e: &Engine<C>, name: &str) -> Option<Self> {
        e.get_policy(name)
    }
    fn delete<C: Clock>(e: &Engine<C>, name: &str) -> Result<(), EngineError> {
        e.delete_policy(name)
    }
}

impl Definition for CampaignDef {
    const PARAM: &'static str = "id";
    const WHAT: &'static str = "campaign";
    fn put<C: Clock>(
        e: &Engine<C>,
        name: &str,
        def: Self,
        fresh: bool,
    ) -> Result<Vec<Warning>, EngineError> {
        e.put_campaign_as(name, def, fresh)
    }
    fn get<C: Clock>(e: &Engine<C>, name: &str) -> Option<Self> {
        e.get_campaign(name)
    }
    fn delete<C: Clock>(e: &Engine<C>, name: &str) -> Result<(), EngineError> {
        e.delete_campaign(name)
    }
}

/// PUT: answers the stored definition, its warnings in `Freqcap-Warning`
/// headers (docs/semantics.md §8.4). `?reset=true` starts its counters
/// empty (§5.3).
pub(crate) async fn put_def<C: Clock + 'static, D: Definition>(
    State(s): St<C>,
    ApiPath(name): ApiPath<String>,
    RawQuery(query): RawQuery,
    b: Result<Bytes, BytesRejection>,
) -> Result<(HeaderMap, Json<D>), FrontError> {
    id_param(&s, D::PARAM, &name)?;
    let fresh = reset_param(query.as_deref())?;
    if let Ok(raw) = &b {
        crate::model::check_unique_members(&String::from_utf8_lossy(raw))
            .map_err(|e| FrontError::invalid(&e.field, e.message))?;
    }
    let def: D = body(b)?;
    let e = s.engine.clone();
    let stored = def.clone();
    let warnings = blocking(move || D::put(&e, &name, def, fresh)).await?;
    log_warnings(&warnings);
    Ok((warning_headers(&warnings), Json(stored)))
}

/// `reset` of a PUT's query: `true` or `false` (the default); any other
/// parameter or value is a 400 naming it.
fn reset_param(query: Option<&str>) -> Result<bool, FrontError> {
    let mut reset = false;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match (k, v) {
            ("reset", "true") => reset = true,
            ("reset", "false") => reset = false,
            ("reset", _) => {
                return Err(FrontError::invalid("reset", "must be true or false"));
            }
            _ => {
                return Err(FrontError::invalid(
                    k,
                    "unknown query parameter (a PUT takes only reset=true|false)",
                ));
            }
        }
    }
    Ok(reset)
}

/// A definition's warnings as `Freqcap-Warning: <field>: <message>`
/// headers, one each (the body stays the definition as stored).
pub(crate) fn warning_headers(warnings: &[Warning]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for w in warnings {
        // Messages are ASCII text of ours; a value that is not a valid
        // header is left out rather than failing the PUT.
        if let Ok(v) = HeaderValue::from_str(&format!("{}: {}", w.field, w.message)) {
            h.append("freqcap-warning", v);
        }
    }
    h
}

pub(crate) async fn get_def<C: Clock + 'static, D: Definition>(
    State(s): St<C>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<D>, FrontError> {
    id_param(&s, D::PARAM, &name)?;
    D::get(&s.engine, &name)
        .map(Json)
        .ok_or_else(|| FrontError::not_found(format!("no {} named {name:?}", D::WHAT)))
}

pub(crate) async fn delete_def<C: Clock + 'static, D: Definition>(
    State(s): St<C>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, FrontError> {
    id_param(&s, D::PARAM, &name)?;
    let e = s.engine.clone();
    blocking(move || D::delete(&e, &name)).await?;
    Ok(StatusCode::NO_CONTENT)
}
