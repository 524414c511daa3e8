//! `DELETE /v1/policies/{name}/keys/{key}` (one key's counters emptied) and
//! `DELETE /v1/users/{user}`, `DELETE /v1/ids/{kind}/{ident}` (a viewer
//! erased): docs/semantics.md §5.3 and §7.6. Admin calls; each answers 204
//! once durable.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

use std::sync::Arc;

use super::St;
use super::request::*;
use crate::clock::Clock;
use crate::front::call::*;
use crate::front::{AppState, FrontError};

/// Empties policy `name`'s counters for `key`: 204, whether or not the key
/// had any; 404 for an unknown policy.
pub(crate) async fn reset_key<C: Clock + 'static>(
    State(s): St<C>,
    ApiPath((name, key)): ApiPath<(String, String)>,
) -> Result<StatusCode, FrontError> {
    id_param(&s, "name", &name)?;
    id_param(&s, "key", &key)?;
    let e = s.engine.clone();
    blocking(move || e.reset_key(&name, &key)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Erases a user: 204, whether or not it had records. In owner mode the
/// user's owner erases it (the request is forwarded there), since its
/// memory holds the record.
pub(crate) async fn erase_user<C: Clock + 'static>(
    State(s): St<C>,
    ApiPath(user): ApiPath<String>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, FrontError> {
    id_param(&s, "user", &user)?;
    erase_at_owner(&s, ("user".to_owned(), user), &headers, &uri).await
}

/// Erases an identity of any kind: 204, whether or not it had records;
/// forwarded to its owner in owner mode, as a user's erasure.
pub(crate) async fn erase_identity<C: Clock + 'static>(
    State(s): St<C>,
    ApiPath((kind, ident)): ApiPath<(String, String)>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, FrontError> {
    id_param(&s, "ident", &ident)?;
    erase_at_owner(&s, (kind, ident), &headers, &uri).await
}

/// Erases identity (kind, id) here, or forwards the request to its owner
/// in owner mode.
async fn erase_at_owner<C: Clock + 'static>(
    s: &Arc<AppState<C>>,
    (kind, id): (String, String),
    headers: &HeaderMap,
    uri: &Uri,
) -> Result<Response, FrontError> {
    let owner = s.engine.owner_of_identity(&kind, &id);
    if let Some(r) = s
        .forwarder
        .to_owner(owner, Method::DELETE, uri.path(), headers, Bytes::new())
        .await
    {
        return r;
    }
    let e = s.engine.clone();
    blocking(move || e.erase(&kind, &id)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
