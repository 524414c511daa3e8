//! A client of freqcap's HTTP API that behaves well when freqcap says no or
//! is overloaded (cargo feature `client`; docs/clients.md).
//!
//! - Typed calls for every endpoint ([`types`]).
//! - A deadline per call, retries included.
//! - Retries only where repeating cannot debit twice: reads, definitions
//!   (PUT and DELETE are idempotent), commit and release by id, events that
//!   all carry an `event_id`, and a check or screen that carries its own
//!   `reservation_id`. Never a plain check or screen. A request that never
//!   reached a node (connection refused) is tried on the next node whatever
//!   it is.
//! - Exponential backoff with full jitter, never sooner than `Retry-After` or
//!   `retry_after_ms` ([`backoff`]).
//! - Client-side adaptive throttling ([`throttle`]): 429 and 503 answers
//!   count as not accepted.
//! - Fail-open or fail-closed per call, for check and screen.
//! - Several nodes: consistent hashing on the user or key ([`ring`]) keeps
//!   each on one node (the cluster's affinity); a node that refuses
//!   connections is skipped for a while and its keys go to the next node.

pub mod backoff;
pub mod ring;
pub mod throttle;
pub mod types;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use reqwest::{Method, StatusCode, header};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::PolicyDef;
use crate::model::CampaignDef;
pub use backoff::Backoff;
pub use ring::Ring;
pub use throttle::{AdaptiveThrottle, ThrottleFigures};
pub use types::*;

/// What a call can fail with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// freqcap answered with an error body (docs/semantics.md §8.5).
    #[error("{status} {code}: {message}")]
    Api {
        status: u16,
        /// `invalid_argument`, `not_found`, `conflict`, `overloaded`, ...
        code: String,
        message: String,
        /// The field an `invalid_argument` names, when it names one.
        field: Option<String>,
        /// What the server asked to wait (`Retry-After`), if anything.
        retry_after: Option<Duration>,
    },
    /// The call's deadline passed (retries included).
    #[error("the deadline of {0:?} passed")]
    Deadline(Duration),
    /// No node could be reached.
    #[error("no freqcap node could be reached: {0}")]
    Unreachable(String),
    /// Rejected here without being sent: adaptive throttling.
    #[error("rejected locally by adaptive throttling (p = {0:.3})")]
    Throttled(f64),
    /// An answer that is not what the API documents.
    #[error("unexpected answer: {0}")]
    Decode(String),
    /// The client was built wrongly.
    #[error("client configuration: {0}")]
    Config(String),
}

impl Error {
    /// The API error code, for [`Error::Api`].
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether freqcap itself was not asked or did not answer in time: what
    /// fail-open lets through.
    fn is_unavailability(&self) -> bool {
        match self {
            Error::Api { status, .. } => *status >= 500,
            Error::Deadline(_) | Error::Unreachable(_) => true,
            Error::Throttled(_) | Error::Decode(_) | Error::Config(_) => false,
        }
    }
}

/// What a check or screen answers when freqcap cannot be asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FailMode {
    /// An error (the default).
    #[default]
    Closed,
    /// Allowed (check) or every candidate eligible (screen), marked
    /// `failed_open`; errors of the request itself (4xx) and local
    /// throttling stay errors.
    Open,
}

/// Per-call settings (a client's defaults unless given).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallOptions {
    /// The whole call, retries and backoff included.
    pub deadline: Duration,
    pub fail: FailMode,
}

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct Builder {
    nodes: Vec<String>,
    token: Option<String>,
    defaults: CallOptions,
    backoff: Backoff,
    throttle: Option<(f64, Duration)>,
    seed: u64,
    cooldown: Duration,
}

impl Builder {
    /// The nodes' base URLs (`http://127.0.0.1:8080`; a bare `host:port`
    /// means http).
    pub fn new<S: Into<String>>(nodes: impl IntoIterator<Item = S>) -> Builder {
        Builder {
            nodes: nodes.into_iter().map(Into::into).collect(),
            token: None,
            defaults: CallOptions {
                deadline: Duration::from_secs(1),
                fail: FailMode::Closed,
            },
            backoff: Backoff::default(),
            throttle: Some((2.0, Duration::from_secs(120))),
            seed: 0x5eed,
            cooldown: Duration::from_secs(2),
        }
    }

    /// The bearer token (decision or admin).
    pub fn token(mut self, token: impl Into<String>) -> Builder {
        self.token = Some(token.into());
        self
    }

    /// The default deadline of a call (1 s; ad servers use ~10 ms).
    pub fn deadline(mut self, d: Duration) -> Builder {
        self.defaults.deadline = d;
        self
    }

    /// The default fail mode of check and screen.
    pub fn fail(mut self, f: FailMode) -> Builder {
        self.defaults.fail = f;
        self
    }

    pub fn backoff(mut self, b: Backoff) -> Builder {
        self.backoff = b;
        self
    }

    /// Adaptive throttling with `k` over `window` (default K = 2, 2 minutes);
    /// `None` turns it off.
    pub fn adaptive_throttling(mut self, t: Option<(f64, Duration)>) -> Builder {
        self.throttle = t;
        self
    }

    /// The seed of the jitter and throttling draws (tests).
    pub fn seed(mut self, seed: u64) -> Builder {
        self.seed = seed;
        self
    }

    /// How long a node that refused a connection is skipped (2 s).
    pub fn cooldown(mut self, d: Duration) -> Builder {
        self.cooldown = d;
        self
    }

    pub fn build(self) -> Result<Client, Error> {
        if self.nodes.is_empty() {
            return Err(Error::Config("at least one node is needed".into()));
        }
        if let Some((k, w)) = self.throttle
            && (k.is_nan() || k < 1.0 || w.is_zero())
        {
            return Err(Error::Config(
                "adaptive throttling needs k ≥ 1 and a window above 0".into(),
            ));
        }
        let mut bases = Vec::with_capacity(self.nodes.len());
        for n in &self.nodes {
            let base = if n.contains("://") {
                n.trim_end_matches('/').to_owned()
            } else {
                format!("http://{}", n.trim_end_matches('/'))
            };
            reqwest::Url::parse(&base).map_err(|e| Error::Config(format!("node {n:?}: {e}")))?;
            bases.push(base);
        }
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| Error::Config(e.to_string()))?;
        Ok(Client {
            ring: Ring::new(&bases),
            down_until: bases.iter().map(|_| Mutex::new(None)).collect(),
            nodes: bases,
            http,
            token: self.token,
            defaults: self.defaults,
            backoff: self.backoff,
            throttle: self
                .throttle
                .map(|(k, w)| AdaptiveThrottle::new(k, w, self.seed)),
            rng: Mutex::new(Xoshiro256PlusPlus::seed_from_u64(self.seed ^ 0x9e37)),
            next: AtomicUsize::new(0),
            cooldown: self.cooldown,
        })
    }
}

/// See the module documentation. Cheap to share: one per process.
pub struct Client {
    nodes: Vec<String>,
    down_until: Vec<Mutex<Option<Instant>>>,
    ring: Ring,
    http: reqwest::Client,
    token: Option<String>,
    defaults: CallOptions,
    backoff: Backoff,
    throttle: Option<AdaptiveThrottle>,
    rng: Mutex<Xoshiro256PlusPlus>,
    /// Round robin for calls with no user or key.
    next: AtomicUsize,
    cooldown: Duration,
}

/// One HTTP call as the retry loop sees it.
struct Call<'a> {
    method: Method,
    path: String,
    body: Option<Vec<u8>>,
    /// The user or key it is about: the node it goes to.
    affinity: Option<&'a str>,
    /// Whether repeating it cannot debit twice.
    retry: bool,
    /// Statuses whose body is the answer (check: 200 and 429).
    ok: &'static [u16],
    opts: CallOptions,
}

/// A path segment, percent-encoded (ids may hold any byte but `/`-safe ones
/// are common; everything outside RFC 3986's unreserved set is encoded).
fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn json<T: Serialize>(v: &T) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(v).map_err(|e| Error::Config(format!("cannot encode the body: {e}")))
}

/// An error body's parts; the field of an `invalid_argument` leads its
/// message (`cost: must be ...`).
fn api_error(status: StatusCode, headers: &header::HeaderMap, body: &[u8]) -> Error {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let code = v["error"]["code"].as_str().unwrap_or("unknown").to_owned();
    let message = v["error"]["message"]
        .as_str()
        .map_or_else(|| String::from_utf8_lossy(body).into_owned(), str::to_owned);
    let field = (code == "invalid_argument")
        .then(|| message.split_once(": ").map(|(f, _)| f.to_owned()))
        .flatten()
        .filter(|f| !f.is_empty() && !f.contains(' '));
    Error::Api {
        status: status.as_u16(),
        code,
        message,
        field,
        retry_after: retry_after(headers, &v),
    }
}

/// `Retry-After` (seconds) or the body's `retry_after_ms`, whichever is
/// longer.
fn retry_after(headers: &header::HeaderMap, body: &serde_json::Value) -> Option<Duration> {
    let h = headers
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let b = body["retry_after_ms"].as_u64().map(Duration::from_millis);
    h.max(b)
}

impl Client {
    /// A client of the nodes at `nodes`, with the defaults of [`Builder`].
    pub fn new<S: Into<String>>(nodes: impl IntoIterator<Item = S>) -> Result<Client, Error> {
        Builder::new(nodes).build()
    }

    /// The adaptive throttle's figures, if it is on.
    pub fn throttle_figures(&self) -> Option<ThrottleFigures> {
        self.throttle.as_ref().map(|t| t.figures(Instant::now()))
    }

    /// The node a user or key goes to while every node is up (its index in
    /// the list the client was built with).
    pub fn node_of(&self, key: &str) -> usize {
        self.ring.order(key).first().copied().unwrap_or(0)
    }

    /// The nodes to try, in order: the key's ring order (or round robin),
    /// nodes in their cooldown last.
    fn order(&self, affinity: Option<&str>) -> Vec<usize> {
        let mut order = match affinity {
            Some(k) => self.ring.order(k),
            None => {
                let n = self.nodes.len();
                let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
                (0..n).map(|i| (start + i) % n).collect()
            }
        };
        let now = Instant::now();
        let down = |i: usize| {
            self.down_until[i]
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some_and(|t| t > now)
        };
        order.sort_by_key(|&i| down(i));
        order
    }

    fn mark_down(&self, node: usize) {
        *self.down_until[node]
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + self.cooldown);
    }

    fn delay(&self, n: u32, asked: Option<Duration>) -> Duration {
        let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
        self.backoff.delay(n, asked, &mut *rng)
    }

    /// One try on `node`: the answer's status, headers and body.
    async fn send(
        &self,
        node: usize,
        c: &Call<'_>,
        left: Duration,
    ) -> Result<(StatusCode, header::HeaderMap, Vec<u8>), reqwest::Error> {
        let url = format!("{}{}", self.nodes[node], c.path);
        let mut rb = self.http.request(c.method.clone(), url).timeout(left);
        if let Some(t) = &self.token {
            rb = rb.bearer_auth(t);
        }
        if let Some(b) = &c.body {
            rb = rb
                .header(header::CONTENT_TYPE, "application/json")
                .body(b.clone());
        }
        let r = rb.send().await?;
        let status = r.status();
        let headers = r.headers().clone();
        let body = r.bytes().await?.to_vec();
        Ok((status, headers, body))
    }

    /// The retry loop (module documentation).
    async fn call<T: DeserializeOwned>(&self, c: Call<'_>) -> Result<T, Error> {
        let started = Instant::now();
        let deadline = started + c.opts.deadline;
        if let Some(t) = &self.throttle
            && !t.admit(started)
        {
            return Err(Error::Throttled(t.figures(started).probability));
        }
        // Counted in the throttle when the call is over, however it ends.
        let mut attempt = Attempt {
            throttle: self.throttle.as_ref(),
            accepted: false,
        };
        let order = self.order(c.affinity);
        let mut node_i = 0;
        let mut retries = 0u32;
        let mut last = Error::Unreachable("no node was tried".into());
        loop {
            let now = Instant::now();
            let Some(left) = deadline
                .checked_duration_since(now)
                .filter(|d| !d.is_zero())
            else {
                return Err(match last {
                    e @ Error::Api { .. } => e,
                    _ => Error::Deadline(c.opts.deadline),
                });
            };
            let node = order[node_i % order.len()];
            match self.send(node, &c, left).await {
                Err(e) if e.is_connect() => {
                    // Nothing reached the node: any call may go to the next.
                    self.mark_down(node);
                    last = Error::Unreachable(format!("{}: {e}", self.nodes[node]));
                    node_i += 1;
                    if node_i >= order.len() {
                        return Err(last);
                    }
                }
                Err(e) => {
                    // Sent, no answer: it may have been applied.
                    last = if e.is_timeout() {
                        Error::Deadline(c.opts.deadline)
                    } else {
                        Error::Unreachable(format!("{}: {e}", self.nodes[node]))
                    };
                    if !c.retry || retries >= self.backoff.max_retries {
                        return Err(last);
                    }
                    let d = self.delay(retries, None);
                    retries += 1;
                    if Instant::now() + d >= deadline {
                        return Err(last);
                    }
                    tokio::time::sleep(d).await;
                }
                Ok((status, headers, body)) => {
                    let s = status.as_u16();
                    attempt.accepted |= s != 429 && s != 503;
                    if c.ok.contains(&s) {
                        // 204 has no body: read it as null.
                        let body = if body.is_empty() {
                            b"null".to_vec()
                        } else {
                            body
                        };
                        return serde_json::from_slice(&body).map_err(|e| {
                            Error::Decode(format!(
                                "{} {}: {e}: {}",
                                c.method,
                                c.path,
                                String::from_utf8_lossy(&body)
                            ))
                        });
                    }
                    let err = api_error(status, &headers, &body);
                    let retryable = c.retry && (s >= 500 || s == 408);
                    if !retryable || retries >= self.backoff.max_retries {
                        return Err(err);
                    }
                    let asked = match &err {
                        Error::Api { retry_after, .. } => *retry_after,
                        _ => None,
                    };
                    let d = self.delay(retries, asked);
                    retries += 1;
                    if Instant::now() + d >= deadline {
                        return Err(err);
                    }
                    last = err;
                    tokio::time::sleep(d).await;
                }
            }
        }
    }

    /// A call with no answer body (204).
    async fn call_empty(&self, c: Call<'_>) -> Result<(), Error> {
        self.call::<serde_json::Value>(c).await.map(|_| ())
    }

    fn opts(&self, o: Option<CallOptions>) -> CallOptions {
        o.unwrap_or(self.defaults)
    }

    // ---- decisions ----

    /// `POST /v1/check` with the client's defaults.
    pub async fn check(&self, req: &Check) -> Result<Decision, Error> {
        self.check_with(req, None).await
    }

    /// `POST /v1/check`; a denial is `Ok` with `allowed: false`.
    pub async fn check_with(&self, req: &Check, o: Option<CallOptions>) -> Result<Decision, Error> {
        let opts = self.opts(o);
        let r = self
            .call(Call {
                method: Method::POST,
                path: "/v1/check".into(),
                body: Some(json(req)?),
                affinity: Some(&req.key),
                retry: req.reservation_id.is_some(),
                ok: &[200, 429],
                opts,
            })
            .await;
        match r {
            Err(e) if opts.fail == FailMode::Open && e.is_unavailability() => Ok(Decision::open()),
            r => r,
        }
    }

    /// `POST /v1/screen` with the client's defaults.
    pub async fn screen(&self, req: &Screen) -> Result<Screened, Error> {
        self.screen_with(req, None).await
    }

    /// `POST /v1/screen`.
    pub async fn screen_with(
        &self,
        req: &Screen,
        o: Option<CallOptions>,
    ) -> Result<Screened, Error> {
        let opts = self.opts(o);
        let r = self
            .call(Call {
                method: Method::POST,
                path: "/v1/screen".into(),
                body: Some(json(req)?),
                affinity: req.user.as_deref(),
                retry: req.reservation_id.is_some(),
                ok: &[200],
                opts,
            })
            .await;
        match r {
            Err(e) if opts.fail == FailMode::Open && e.is_unavailability() => Ok(Screened {
                reservation: None,
                results: req
                    .candidates
                    .iter()
                    .map(|c| ScreenResult {
                        campaign: c.campaign.clone(),
                        eligible: true,
                        denied_by: None,
                        would_deny: None,
                        pacing: None,
                    })
                    .collect(),
                failed_open: true,
            }),
            r => r,
        }
    }

    /// `POST /v1/reservations/{id}/commit` (retried: a repeat reports the
    /// first outcome). Routed by `req.user` when given.
    pub async fn commit(&self, id: &str, req: &Commit) -> Result<Settled, Error> {
        self.call(Call {
            method: Method::POST,
            path: format!("/v1/reservations/{}/commit", seg(id)),
            body: Some(json(req)?),
            affinity: req.user.as_deref(),
            retry: true,
            ok: &[200],
            opts: self.defaults,
        })
        .await
    }

    /// `POST /v1/reservations/{id}/release` (retried).
    pub async fn release(&self, id: &str, user: Option<&str>) -> Result<Settled, Error> {
        self.release_reporting(id, user, None).await
    }

    /// [`Client::release`] with what happened to the work the reservation
    /// admitted, for the policy's adaptive items (docs/adaptive.md). A
    /// retried release reports once: the first one settles it.
    pub async fn release_reporting(
        &self,
        id: &str,
        user: Option<&str>,
        report: Option<Report>,
    ) -> Result<Settled, Error> {
        #[derive(Serialize)]
        struct Body<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            user: Option<&'a str>,
            #[serde(flatten, skip_serializing_if = "Option::is_none")]
            report: Option<Report>,
        }
        self.call(Call {
            method: Method::POST,
            path: format!("/v1/reservations/{}/release", seg(id)),
            body: Some(json(&Body { user, report })?),
            affinity: user,
            retry: true,
            ok: &[200],
            opts: self.defaults,
        })
        .await
    }

    /// `POST /v1/events`: retried only if every event has an `event_id`.
    pub async fn events(&self, events: &[Event]) -> Result<EventsCounted, Error> {
        self.call(Call {
            method: Method::POST,
            path: "/v1/events".into(),
            body: Some(json(&events)?),
            affinity: events.first().and_then(|e| e.user.as_deref()),
            retry: !events.is_empty() && events.iter().all(|e| e.event_id.is_some()),
            ok: &[200],
            opts: self.defaults,
        })
        .await
    }

    // ---- reads ----

    /// `GET /v1/users/{user}/campaigns/{id}`.
    pub async fn usage(&self, user: &str, campaign: &str) -> Result<Usage, Error> {
        self.get(
            format!("/v1/users/{}/campaigns/{}", seg(user), seg(campaign)),
            Some(user),
        )
        .await
    }

    /// `GET /v1/ids/{kind}/{ident}/campaigns/{id}`: the caps scoped to
    /// identity kind `kind` (`household`) for `ident`, and the
    /// campaign-scope ones.
    pub async fn identity_usage(
        &self,
        kind: &str,
        ident: &str,
        campaign: &str,
    ) -> Result<IdentityUsage, Error> {
        self.get(
            format!(
                "/v1/ids/{}/{}/campaigns/{}",
                seg(kind),
                seg(ident),
                seg(campaign)
            ),
            None,
        )
        .await
    }

    /// `POST /v1/forecast`: campaigns' delivery on modelled traffic
    /// (docs/forecast.md). Not retried: one forecast runs at a time, and a
    /// retry would only queue behind it.
    pub async fn forecast(&self, req: &ForecastRequest) -> Result<Forecast, Error> {
        self.call(Call {
            method: Method::POST,
            path: "/v1/forecast".into(),
            body: Some(json(req)?),
            affinity: None,
            retry: false,
            ok: &[200],
            opts: self.defaults,
        })
        .await
    }

    /// `GET /v1/campaigns/{id}/delivery`.
    pub async fn delivery(&self, campaign: &str) -> Result<Delivery, Error> {
        self.get(format!("/v1/campaigns/{}/delivery", seg(campaign)), None)
            .await
    }

    async fn get<T: DeserializeOwned>(
        &self,
        path: String,
        affinity: Option<&str>,
    ) -> Result<T, Error> {
        self.call(Call {
            method: Method::GET,
            path,
            body: None,
            affinity,
            retry: true,
            ok: &[200],
            opts: self.defaults,
        })
        .await
    }

    // ---- definitions ----

    async fn put_def<D: Serialize + DeserializeOwned>(
        &self,
        path: String,
        def: &D,
    ) -> Result<D, Error> {
        self.call(Call {
            method: Method::PUT,
            path,
            body: Some(json(def)?),
            affinity: None,
            retry: true,
            ok: &[200],
            opts: self.defaults,
        })
        .await
    }

    async fn delete(&self, path: String) -> Result<(), Error> {
        self.call_empty(Call {
            method: Method::DELETE,
            path,
            body: None,
            affinity: None,
            retry: true,
            ok: &[204],
            opts: self.defaults,
        })
        .await
    }

    pub async fn put_policy(&self, name: &str, def: &PolicyDef) -> Result<PolicyDef, Error> {
        self.put_def(format!("/v1/policies/{}", seg(name)), def)
            .await
    }

    pub async fn get_policy(&self, name: &str) -> Result<PolicyDef, Error> {
        self.get(format!("/v1/policies/{}", seg(name)), None).await
    }

    pub async fn delete_policy(&self, name: &str) -> Result<(), Error> {
        self.delete(format!("/v1/policies/{}", seg(name))).await
    }

    pub async fn put_campaign(&self, id: &str, def: &CampaignDef) -> Result<CampaignDef, Error> {
        self.put_def(format!("/v1/campaigns/{}", seg(id)), def)
            .await
    }

    pub async fn get_campaign(&self, id: &str) -> Result<CampaignDef, Error> {
        self.get(format!("/v1/campaigns/{}", seg(id)), None).await
    }

    pub async fn delete_campaign(&self, id: &str) -> Result<(), Error> {
        self.delete(format!("/v1/campaigns/{}", seg(id))).await
    }
}

/// A call the throttle let go, counted in it when dropped: accepted if
/// any answer was not a refusal (429, 503).
struct Attempt<'a> {
    throttle: Option<&'a AdaptiveThrottle>,
    accepted: bool,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.throttle {
            t.answered(Instant::now(), self.accepted);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(seg("user-1_a.b~"), "user-1_a.b~");
        assert_eq!(seg("a/b c"), "a%2Fb%20c");
        assert_eq!(seg("é"), "%C3%A9");
    }

    #[test]
    fn error_bodies_name_their_field() {
        let body = br#"{"error": {"code": "invalid_argument", "message": "cost: must be from 0 to 2^53 - 1, got 9007199254740992"}, "retry_after_ms": 1500}"#;
        let mut h = header::HeaderMap::new();
        h.insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        let e = api_error(StatusCode::BAD_REQUEST, &h, body);
        assert_eq!(
            e,
            Error::Api {
                status: 400,
                code: "invalid_argument".into(),
                message: "cost: must be from 0 to 2^53 - 1, got 9007199254740992".into(),
                field: Some("cost".into()),
                retry_after: Some(Duration::from_millis(1500)),
            }
        );
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert!(matches!(
            Client::new(Vec::<String>::new()),
            Err(Error::Config(_))
        ));
        assert!(matches!(
            Client::new(["http://[::1"]),
            Err(Error::Config(_))
        ));
        let b =
            Builder::new(["127.0.0.1:1"]).adaptive_throttling(Some((0.5, Duration::from_secs(1))));
        assert!(matches!(b.build(), Err(Error::Config(_))));
    }
}
