//! The id of the request a task handles (docs/service.md, "Logs"): every
//! log line of a request carries it, and an internal error's answer quotes
//! it so that an operator can find what the client saw.

use std::future::Future;
use std::sync::Arc;

tokio::task_local! {
    /// The id of the request being handled (docs/service.md, "Logs").
    static REQUEST_ID: Arc<str>;
}

/// The id of the request this task handles, if it is one.
pub fn current() -> Option<String> {
    REQUEST_ID.try_with(|id| id.to_string()).ok()
}

/// Runs `f` as the request with id `id`.
pub fn scope<F: Future>(id: Arc<str>, f: F) -> impl Future<Output = F::Output> {
    REQUEST_ID.scope(id, f)
}

/// An id for a logged error: the process's start time and a counter, so ids
/// from two runs of the service do not collide in one log.
pub(crate) fn fresh() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static START: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let start = *START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    format!("{start:x}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}
