//! A tower [`Layer`](::tower::Layer) that rate-limits an HTTP service (axum,
//! hyper, tonic) in one line (feature `tower`; docs/clients.md, "The tower
//! layer"):
//!
//! ```ignore
//! let app = Router::new().route("/", get(handler))
//!     .layer(RateLimitLayer::local(&policy, HeaderKey::new("x-api-key"))?);
//! ```
//!
//! Each request's key comes from a [`KeyExtractor`] (the peer's IP, a
//! header, a closure) and its cost from an optional closure; the decision is
//! an in-process [`KeyedLimiter`] or a remote freqcap through the
//! [`Client`](crate::client::Client). A denial answers 429 with the IETF
//! `RateLimit`/`RateLimit-Policy` fields and `Retry-After`; an allowed
//! request gets the same fields on its response. With shaping, a request
//! that would pass within a bound is delayed instead of refused. When the
//! remote freqcap cannot be asked, fail-closed answers 503 and fail-open lets
//! the request through.
//!
//! With an `adaptive` item in the policy (docs/adaptive.md), each admitted
//! request holds a slot while the inner service runs, and the layer releases
//! it with the latency it measured and the outcome the response shows
//! (429, 503, 504: `dropped`; other 5xx: `ignored`; the rest `ok`; a request
//! dropped before it answers: `ignored`), so the limit follows the service
//! behind it with no code in the application.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::http::header::RETRY_AFTER;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};

use crate::client::{CallOptions, Check, Client, Decision as RemoteDecision, FailMode, Report};
use crate::engine::Priority;
pub use crate::front::ratelimit_fields::HeaderStyle;
use crate::front::ratelimit_fields::{self as headers, RATELIMIT, RATELIMIT_POLICY};
use crate::limits::adaptive::{Outcome, Sample};
use crate::limits::stack::{Decision, Pending};
use crate::{DefinitionError, KeyedLimiter, LimiterOptions, PolicyDef};

/// Where a request's key comes from.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key, or `None` (such requests share the key `-`).
    fn key(&self, parts: &Parts) -> Option<String>;
}

/// The peer's IP address, from axum's `ConnectInfo` (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`).
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp;

impl KeyExtractor for PeerIp {
    fn key(&self, parts: &Parts) -> Option<String> {
        parts
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip().to_string())
    }
}

/// A header's value (an API key, a client id).
#[derive(Debug, Clone)]
pub struct HeaderKey(pub HeaderName);

impl HeaderKey {
    /// # Panics
    /// On a name that is not a valid header name (a programming error,
    /// found at start).
    pub fn new(name: &'static str) -> HeaderKey {
        HeaderKey(HeaderName::from_static(name))
    }
}

impl KeyExtractor for HeaderKey {
    fn key(&self, parts: &Parts) -> Option<String> {
        parts
            .headers
            .get(&self.0)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }
}

/// Any closure from the request's head to its key.
pub struct FnKey<F>(pub F);

impl<F: Fn(&Parts) -> Option<String> + Send + Sync + 'static> KeyExtractor for FnKey<F> {
    fn key(&self, parts: &Parts) -> Option<String> {
        (self.0)(parts)
    }
}

type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;
type PriorityFn = dyn Fn(&Parts) -> Priority + Send + Sync;
type OutcomeFn = dyn Fn(StatusCode) -> Outcome + Send + Sync;

/// How long a measured request holds its slot at most, by default: a
/// handler that never answers gives it back then (docs/semantics.md §4.4).
pub const DEFAULT_HOLD: Duration = Duration::from_secs(60);

/// The outcome a response's status shows of the service's load: 429, 503
/// and 504 say it is overloaded or timed out; another 5xx failed fast and
/// says nothing of load; the rest completed.
pub fn default_outcome(status: StatusCode) -> Outcome {
    match status.as_u16() {
        429 | 503 | 504 => Outcome::Dropped,
        500..=599 => Outcome::Ignored,
        _ => Outcome::Ok,
    }
}

/// What decides.
enum Backend {
    Local(KeyedLimiter<String>),
    Remote {
        client: Arc<Client>,
        policy: String,
        deadline: Duration,
    },
}

struct LayerState {
    backend: Backend,
    key: Box<dyn KeyExtractor>,
    cost: Option<Box<CostFn>>,
    /// The request's class (docs/semantics.md §2.5); `default` unless the
    /// application says. Never read from a client's header by default: a
    /// client could then call itself critical.
    priority: Option<Box<PriorityFn>>,
    fail: FailMode,
    /// Shaping: wait for a denial that passes within this long.
    shape: Option<Duration>,
    /// Measuring: an admitted request holds a reservation at most this long
    /// and releases it with its latency and outcome (an adaptive policy's
    /// default; see the module documentation).
    measure: Option<Duration>,
    outcome: Option<Box<OutcomeFn>>,
    /// How the rate-limit header fields are named (default IETF's).
    header_style: HeaderStyle,
}

/// See the module documentation.
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<LayerState>,
}

impl RateLimitLayer {
    /// Limits by `policy` in this process.
    /// A policy with an `adaptive` item measures every request
    /// ([`RateLimitLayer::measure`], for [`DEFAULT_HOLD`]).
    pub fn local(policy: &PolicyDef, key: impl KeyExtractor) -> Result<Self, DefinitionError> {
        let limiter = KeyedLimiter::new(policy, LimiterOptions::default())?;
        let adaptive = limiter.stack().has_adaptive();
        let layer = Self::with(Backend::Local(limiter), Box::new(key));
        Ok(if adaptive {
            layer.measure(DEFAULT_HOLD)
        } else {
            layer
        })
    }

    /// Limits by the policy named `policy` on a remote freqcap; each
    /// decision waits at most `deadline`.
    pub fn remote(
        client: Arc<Client>,
        policy: impl Into<String>,
        deadline: Duration,
        key: impl KeyExtractor,
    ) -> Self {
        Self::with(
            Backend::Remote {
                client,
                policy: policy.into(),
                deadline,
            },
            Box::new(key),
        )
    }

    fn with(backend: Backend, key: Box<dyn KeyExtractor>) -> Self {
        RateLimitLayer {
            shared: Arc::new(LayerState {
                backend,
                key,
                cost: None,
                priority: None,
                fail: FailMode::Closed,
                shape: None,
                measure: None,
                outcome: None,
                header_style: HeaderStyle::Ietf,
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut LayerState)) -> Self {
        // Not yet shared: the layer is being built.
        if let Some(s) = Arc::get_mut(&mut self.shared) {
            f(s);
        }
        self
    }

    /// A request's cost (default 1).
    pub fn cost(self, f: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.edit(|s| s.cost = Some(Box::new(f)))
    }

    /// A request's priority class (default `default`), for policies whose
    /// items give classes shares: e.g. from an authenticated tier, or from
    /// `x-freqcap-priority` set by a trusted proxy.
    pub fn priority(self, f: impl Fn(&Parts) -> Priority + Send + Sync + 'static) -> Self {
        self.edit(|s| s.priority = Some(Box::new(f)))
    }

    /// What a request gets when the remote freqcap cannot be asked
    /// (default: 503).
    pub fn fail(self, mode: FailMode) -> Self {
        self.edit(|s| s.fail = mode)
    }

    /// Shaping: a request denied but able to pass within `max_wait` waits
    /// and is decided again, instead of being refused.
    pub fn shape(self, max_wait: Duration) -> Self {
        self.edit(|s| s.shape = Some(max_wait))
    }

    /// Measuring, for a policy with an `adaptive` item: each admitted
    /// request holds a slot (at most `hold`, then it expires) while the
    /// inner service runs, and is released with its latency and outcome.
    /// On by default for a local adaptive policy; a remote policy's
    /// contents are not known here, so say it.
    pub fn measure(self, hold: Duration) -> Self {
        self.edit(|s| s.measure = Some(hold))
    }

    /// How the rate-limit header fields are named (default
    /// [`HeaderStyle::Ietf`]; `X-RateLimit-*` for clients written against
    /// Envoy or tower_governor).
    pub fn header_style(self, style: HeaderStyle) -> Self {
        self.edit(|s| s.header_style = style)
    }

    /// How a response's status reads as an outcome (default
    /// [`default_outcome`]).
    pub fn outcome(self, f: impl Fn(StatusCode) -> Outcome + Send + Sync + 'static) -> Self {
        self.edit(|s| s.outcome = Some(Box::new(f)))
    }
}

impl<S> ::tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around another.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<LayerState>,
}

/// A decision, as headers and whether the request may go on (holding a
/// slot, when measured).
enum Verdict {
    Go(HeaderMap, Option<Held>),
    Refuse(HeaderMap),
    /// Remote freqcap unavailable, fail-closed.
    Unavailable,
}

/// A measured request's reservation (a local one boxed: a [`Pending`] is
/// ~240 bytes, and an unmeasured verdict should not carry them).
enum Held {
    Local(Box<Pending>),
    Remote(String),
}

/// A measured request's slot, released once with what happened: by
/// [`Slot::finish`], or, if the request is dropped first (its client went
/// away), as `ignored` when dropped.
struct Slot {
    shared: Arc<LayerState>,
    key: String,
    held: Option<Held>,
    start: Instant,
}

impl Slot {
    fn finish(mut self, outcome: Outcome) {
        self.release(outcome);
    }

    fn release(&mut self, outcome: Outcome) {
        let Some(held) = self.held.take() else { return };
        let latency = self.start.elapsed();
        match (&self.shared.backend, held) {
            (Backend::Local(l), Held::Local(p)) => {
                let sample = Sample {
                    latency: u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX),
                    outcome,
                };
                l.release_reporting(self.key.as_str(), &p, Some(sample));
            }
            (Backend::Remote { client, .. }, Held::Remote(id)) => {
                // Not awaited: the response does not wait for the release.
                // Outside a runtime (a drop at shutdown) the slot expires.
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let client = client.clone();
                    let report = Report::new(latency, outcome);
                    rt.spawn(async move {
                        if let Err(e) = client.release_reporting(&id, None, Some(report)).await {
                            tracing::debug!("a measured request's release failed: {e}");
                        }
                    });
                }
            }
            _ => {}
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.release(Outcome::Ignored);
    }
}

fn remote_headers(d: &RemoteDecision, style: HeaderStyle) -> HeaderMap {
    let mut h = HeaderMap::new();
    let sf = headers::sf_string;
    // The tightest item: least remaining, ties to the later reset.
    let tightest = d
        .limits
        .iter()
        .min_by_key(|i| (i.remaining, std::cmp::Reverse(i.reset_after_ms)));
    let retry = |h: &mut HeaderMap| {
        if !d.allowed
            && let Some(ms) = d.retry_after_ms
            && let Ok(v) = HeaderValue::from_str(&ms.div_ceil(1000).to_string())
        {
            h.insert(RETRY_AFTER, v);
        }
    };
    if style != HeaderStyle::Ietf {
        if let Some(t) = tightest {
            let reset = t.reset_after_ms.div_ceil(1000);
            for (name, v) in headers::legacy(style, t.limit, t.remaining, reset)
                .into_iter()
                .flatten()
            {
                h.insert(name, HeaderValue::from(headers::sf_int(v)));
            }
        }
        retry(&mut h);
        return h;
    }
    let policy: Vec<String> = d
        .limits
        .iter()
        .map(|i| format!("{};q={}", sf(&i.name), i.limit))
        .collect();
    if let Ok(v) = HeaderValue::from_str(&policy.join(", ")) {
        h.insert(RATELIMIT_POLICY, v);
    }
    if let Some(t) = tightest
        && let Ok(v) = HeaderValue::from_str(&format!(
            "{};r={};t={}",
            sf(&t.name),
            t.remaining,
            t.reset_after_ms.div_ceil(1000)
        ))
    {
        h.insert(RATELIMIT, v);
    }
    retry(&mut h);
    h
}

impl LayerState {
    fn local_once(
        &self,
        limiter: &KeyedLimiter<String>,
        key: &str,
        cost: u64,
        class: Priority,
    ) -> (Decision, HeaderMap, Option<Held>) {
        let (d, pending) = match self.measure {
            Some(hold) => {
                let ttl = u64::try_from(hold.as_nanos()).unwrap_or(u64::MAX);
                limiter.reserve_as(key, cost, ttl, class)
            }
            None => (limiter.check_as(key, cost, class), None),
        };
        let mut h = HeaderMap::new();
        headers::add(&mut h, limiter.stack(), &d, self.header_style);
        (d, h, pending.map(|p| Held::Local(Box::new(p))))
    }

    async fn decide(&self, key: &str, cost: u64, class: Priority) -> Verdict {
        match &self.backend {
            Backend::Local(l) => {
                let (d, h, held) = self.local_once(l, key, cost, class);
                if d.allowed {
                    return Verdict::Go(h, held);
                }
                match (self.shape, d.retry_after) {
                    (Some(max), Some(r)) if r <= max.as_nanos() => {
                        tokio::time::sleep(Duration::from_nanos(
                            u64::try_from(r).unwrap_or(u64::MAX),
                        ))
                        .await;
                        let (d, h, held) = self.local_once(l, key, cost, class);
                        if d.allowed {
                            Verdict::Go(h, held)
                        } else {
                            Verdict::Refuse(h)
                        }
                    }
                    _ => Verdict::Refuse(h),
                }
            }
            Backend::Remote {
                client,
                policy,
                deadline,
            } => {
                let ask = || async {
                    let opts = CallOptions {
                        deadline: *deadline,
                        fail: FailMode::Closed,
                    };
                    let mut check = Check::policy(policy.clone(), key)
                        .cost(cost)
                        .priority(class);
                    if let Some(hold) = self.measure {
                        let ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX);
                        check = check.reserve(Some(ms.max(1)));
                    }
                    client.check_with(&check, Some(opts)).await
                };
                let mut r = ask().await;
                if let (Some(max), Ok(d)) = (self.shape, &r)
                    && !d.allowed
                    && let Some(ms) = d.retry_after_ms
                    && Duration::from_millis(ms) <= max
                {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    r = ask().await;
                }
                match r {
                    Ok(d) if d.allowed => {
                        let held = d.reservation.clone().map(Held::Remote);
                        Verdict::Go(remote_headers(&d, self.header_style), held)
                    }
                    Ok(d) => Verdict::Refuse(remote_headers(&d, self.header_style)),
                    Err(_) if self.fail == FailMode::Open => Verdict::Go(HeaderMap::new(), None),
                    Err(_) => Verdict::Unavailable,
                }
            }
        }
    }
}

fn answer<B: From<String>>(status: StatusCode, text: String, h: HeaderMap) -> Response<B> {
    let mut r = Response::new(B::from(text));
    *r.status_mut() = status;
    r.headers_mut().extend(h);
    r
}

impl<S, ReqB, ResB> ::tower::Service<Request<ReqB>> for RateLimit<S>
where
    S: ::tower::Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    ReqB: Send + 'static,
    ResB: From<String> + Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The clone that was polled ready serves this call (tower's rule).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let key = shared.key.key(&parts).unwrap_or_else(|| "-".to_owned());
            let cost = shared.cost.as_ref().map_or(1, |f| f(&parts));
            let class = shared
                .priority
                .as_ref()
                .map_or_else(Priority::default, |f| f(&parts));
            match shared.decide(&key, cost, class).await {
                Verdict::Go(h, held) => {
                    let slot = held.map(|held| Slot {
                        shared: shared.clone(),
                        key,
                        held: Some(held),
                        start: Instant::now(),
                    });
                    let answered = inner.call(Request::from_parts(parts, body)).await;
                    if let Some(slot) = slot {
                        let outcome = match &answered {
                            Ok(r) => shared
                                .outcome
                                .as_ref()
                                .map_or_else(|| default_outcome(r.status()), |f| f(r.status())),
                            // The service failed, not slowly: no signal.
                            Err(_) => Outcome::Ignored,
                        };
                        slot.finish(outcome);
                    }
                    let mut r = answered?;
                    r.headers_mut().extend(h);
                    Ok(r)
                }
                Verdict::Refuse(h) => {
                    let wait = h
                        .get(RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .map_or_else(String::new, |s| format!("; retry in {s} s"));
                    Ok(answer(
                        StatusCode::TOO_MANY_REQUESTS,
                        format!("rate limited{wait}\n"),
                        h,
                    ))
                }
                Verdict::Unavailable => Ok(answer(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the rate limiter cannot be reached\n".to_owned(),
                    HeaderMap::new(),
                )),
            }
        })
    }
}
