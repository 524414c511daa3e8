//! Operations: `POST /v1/admin/checkpoint` (a backup into `backup_dir`),
//! `/metrics` and `/openapi.json`.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::St;
use super::openapi;
use super::request::*;
use crate::clock::Clock;
use crate::engine::EngineError;
use crate::front::call::*;
use crate::front::{FrontError, metrics};

/// `POST /v1/admin/checkpoint`: where to write the copy.
#[derive(Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckpointBody {
    /// A new directory inside the configured `backup_dir`: its name
    /// (`2026-11-22`), or its full path there. On the data directory's file
    /// system the copy is made of hard links, so it costs little space until
    /// the live data is compacted away. The answer gives the full path.
    dir: String,
}

/// The longest checkpoint directory name, in bytes: a file name has at most
/// 255 (Linux's NAME_MAX, and most file systems' limit elsewhere), and
/// RocksDB writes the checkpoint into `<dir>.tmp` before renaming it.
const MAX_DIR_NAME: usize = 255 - ".tmp".len();

/// Where a checkpoint named `dir` goes: directly inside `backup_dir`, never
/// elsewhere (the endpoint used to write wherever it was told).
pub(crate) fn checkpoint_dir(
    backup_dir: Option<&std::path::Path>,
    dir: &str,
) -> Result<std::path::PathBuf, FrontError> {
    use std::path::{Component, Path};
    let Some(base) = backup_dir else {
        return Err(FrontError::invalid(
            "dir",
            "checkpoints are off: the service has no backup_dir configured",
        ));
    };
    if dir.is_empty() || dir.contains('\0') {
        return Err(FrontError::invalid(
            "dir",
            "must name a directory (no NUL bytes)",
        ));
    }
    let p = Path::new(dir);
    let name = match p.parent() {
        // A bare name.
        Some(parent) if parent.as_os_str().is_empty() => p.file_name(),
        // A full path whose parent is the backup directory itself.
        Some(parent) if parent == base => p.file_name(),
        _ => None,
    };
    match name
        .map(Path::new)
        .map(|n| n.components().collect::<Vec<_>>())
    {
        // A longer name fails in the store's mkdir (ENAMETOOLONG): a 500
        // and a store failure for the client's mistake.
        Some(c) if matches!(c.as_slice(), [Component::Normal(n)] if n.len() > MAX_DIR_NAME) => {
            Err(FrontError::invalid(
                "dir",
                format!(
                    "a directory name has at most {MAX_DIR_NAME} bytes, got {}",
                    c[0].as_os_str().len()
                ),
            ))
        }
        Some(c) if matches!(c.as_slice(), [Component::Normal(_)]) => {
            Ok(base.join(c[0].as_os_str()))
        }
        _ => Err(FrontError::invalid(
            "dir",
            format!(
                "must be a new directory's name, or a path directly inside backup_dir ({})",
                base.display()
            ),
        )),
    }
}

pub(crate) async fn checkpoint<C: Clock + 'static>(
    State(s): St<C>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<CheckpointBody>, FrontError> {
    let b: CheckpointBody = body(b)?;
    let dir = checkpoint_dir(s.options.backup_dir.as_deref(), &b.dir)?;
    if dir.exists() {
        return Err(FrontError::conflict(format!(
            "dir: {:?} already exists; name a new directory",
            dir.display().to_string()
        )));
    }
    let e = s.engine.clone();
    let target = dir.clone();
    blocking(move || e.store().checkpoint(&target).map_err(EngineError::from)).await?;
    let dir = dir.display().to_string();
    tracing::info!(%dir, "checkpoint written");
    Ok(Json(CheckpointBody { dir }))
}

pub(crate) async fn metrics_text<C: Clock + 'static>(
    State(s): St<C>,
) -> Result<Response, FrontError> {
    // Off the async threads: with a shared store a campaign's budget
    // figures read the fleet's spend from Redis, a blocking call (which
    // panics on an async thread).
    let text = tokio::task::spawn_blocking(move || s.metrics.render())
        .await
        .map_err(|_| FrontError::internal("cannot render the metrics"))?
        .map_err(|_| FrontError::internal("cannot render the metrics"))?;
    let mut r = text.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(metrics::CONTENT_TYPE),
    );
    Ok(r)
}

pub(crate) async fn openapi_json() -> Response {
    let mut r = openapi::document_text().into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
