//! The engine calls every front makes, and where they run: on the
//! executor when every record they need is in memory (the usual case: a
//! hand-off to a blocking thread and back costs more than the decision),
//! else on a blocking thread, where reading a cold record from disk is fine.
//! Also the checks of a request's ids and the units every front reports.

use super::{AppState, FrontError};
use crate::MAX_EXACT;
use crate::clock::Nanos;
use crate::clock::{Clock, ceil_ms};
use crate::engine::{Engine, EngineError};
use crate::model::{LimitDef, Warning};

/// The target of tracing spans (`src/front/trace.rs`).
const TRACE: &str = super::trace::TARGET;

/// A path parameter over the id length limit is a 400 naming it, not a 404.
pub(crate) fn id_param<C: Clock>(
    s: &AppState<C>,
    field: &str,
    value: &str,
) -> Result<(), FrontError> {
    let max = s.engine.options().max_id_len;
    if value.is_empty() || value.len() > max {
        return Err(FrontError::invalid(
            field,
            format!("must be 1 to {max} bytes, got {}", value.len()),
        ));
    }
    Ok(())
}

/// An engine call's result.
pub(crate) type Decided<T> = Result<T, EngineError>;

/// Decides `req` here, on the executor, when `here` can (every record it
/// needs is in memory, the usual case: a hand-off to a blocking thread and
/// back would cost more than the decision); else runs `there` on a blocking
/// thread, where reading a cold record from disk is fine.
pub(crate) async fn in_memory_or_blocking<
    C: Clock + 'static,
    Q: Send + 'static,
    T: Send + 'static,
>(
    s: &AppState<C>,
    req: Q,
    here: fn(&Engine<C>, &Q) -> Option<Decided<T>>,
    there: fn(&Engine<C>, &Q) -> Decided<T>,
) -> Result<T, FrontError> {
    {
        let _decide = tracing::info_span!(target: TRACE, "decide", placement = "memory").entered();
        if let Some(r) = here(&s.engine, &req) {
            return r.map_err(FrontError::from);
        }
    }
    let e = s.engine.clone();
    blocking(move || there(&e, &req)).await
}

/// Commits reservation `id` for every front: a live reservation is settled
/// here and its writes awaited without parking a thread; a late commit
/// (which may read a cold record) runs on a blocking thread.
pub(crate) async fn commit_reservation<C: Clock + 'static>(
    s: &AppState<C>,
    id: String,
    req: crate::engine::CommitRequest,
) -> Result<crate::engine::CommitOutcome, FrontError> {
    match s.engine.commit_in_memory(&id, &req) {
        Some(pending) => Ok(pending?.wait_async().await?),
        None => {
            let e = s.engine.clone();
            blocking(move || e.commit(&id, &req)).await
        }
    }
}

/// Counts events for every front: here when every user's record is in
/// memory, awaited without parking a thread; else on a blocking thread.
/// The number counted (the rest were duplicates). At least one event is
/// needed, on every front (INVALID_ARGUMENT naming `events`).
pub(crate) async fn count_events<C: Clock + 'static>(
    s: &AppState<C>,
    evs: Vec<crate::engine::Event>,
) -> Result<usize, FrontError> {
    if evs.is_empty() {
        return Err(FrontError::invalid(
            "events",
            "at least one event is needed",
        ));
    }
    match s.engine.events_in_memory(&evs) {
        Some(pending) => Ok(pending?.wait_async().await?),
        None => {
            let e = s.engine.clone();
            blocking(move || e.events(&evs)).await
        }
    }
}

/// Runs an engine call that may wait on disk (or on Redis) off the async
/// executor, in a `decide` span within the request's.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::engine::EngineError> + Send + 'static,
) -> Result<T, FrontError> {
    let span = tracing::info_span!(target: TRACE, "decide", placement = "blocking");
    match tokio::task::spawn_blocking(move || span.in_scope(f)).await {
        Ok(r) => r.map_err(FrontError::from),
        Err(e) => Err(FrontError::internal(format!("request task failed: {e}"))),
    }
}

/// A reported duration: ms rounded up, saturating (docs/semantics.md §1.5).
pub(crate) fn ms(ns: impl Into<crate::clock::Span>) -> u64 {
    ceil_ms(ns).min(MAX_EXACT)
}

/// Definition warnings (e.g. a redundant cap) are accepted but logged, so the
/// operator sees them.
pub(crate) fn log_warnings(warnings: &[Warning]) {
    for w in warnings {
        tracing::warn!(field = %w.field, "definition warning: {}", w.message);
    }
}

/// A reported instant, RFC 3339 (empty past jiff's range, which no
/// decision reaches).
pub(crate) fn rfc3339(ns: Nanos) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(ns))
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// A campaign's budget pacing as its JSON (`"even"` when none is given).
pub(crate) fn pacing_of<C: Clock>(
    engine: &crate::engine::Engine<C>,
    id: &str,
) -> serde_json::Value {
    engine
        .get_campaign(id)
        .and_then(|c| c.budget)
        .and_then(|b| match b.limit {
            LimitDef::Budget(b) => b
                .pacing
                .map(|p| serde_json::to_value(p).unwrap_or_default()),
            _ => None,
        })
        .unwrap_or_else(|| "even".into())
}
