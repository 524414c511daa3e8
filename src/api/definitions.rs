//! `PUT`/`GET`/`DELETE /v1/policies/{name}` and `/v1/campaigns/{id}`: one
//! set of handlers for both kinds of definition.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
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
    fn put<C: Clock>(e: &Engine<C>, name: &str, def: Self) -> Result<Vec<Warning>, EngineError>;
    fn get<C: Clock>(e: &Engine<C>, name: &str) -> Option<Self>;
    fn delete<C: Clock>(e: &Engine<C>, name: &str) -> Result<(), EngineError>;
}

impl Definition for PolicyDef {
    const PARAM: &'static str = "name";
    const WHAT: &'static str = "policy";
    fn put<C: Clock>(e: &Engine<C>, name: &str, def: Self) -> Result<Vec<Warning>, EngineError> {
        e.put_policy(name, def)
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
    fn put<C: Clock>(e: &Engine<C>, name: &str, def: Self) -> Result<Vec<Warning>, EngineError> {
        e.put_campaign(name, def)
    }
    fn get<C: Clock>(e: &Engine<C>, name: &str) -> Option<Self> {
        e.get_campaign(name)
    }
    fn delete<C: Clock>(e: &Engine<C>, name: &str) -> Result<(), EngineError> {
        e.delete_campaign(name)
    }
}

/// PUT: answers the stored definition (docs/semantics.md §8.4).
pub(crate) async fn put_def<C: Clock + 'static, D: Definition>(
    State(s): St<C>,
    ApiPath(name): ApiPath<String>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<D>, FrontError> {
    id_param(&s, D::PARAM, &name)?;
    if let Ok(raw) = &b {
        crate::model::check_unique_members(&String::from_utf8_lossy(raw))
            .map_err(|e| FrontError::invalid(&e.field, e.message))?;
    }
    let def: D = body(b)?;
    let e = s.engine.clone();
    let stored = def.clone();
    let warnings = blocking(move || D::put(&e, &name, def)).await?;
    log_warnings(&warnings);
    Ok(Json(stored))
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
