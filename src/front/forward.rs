//! Owner mode (docs/cluster.md, "Owner mode"): a request about a user
//! another node owns is sent to that node as it came (method, path, body,
//! `Host`, credentials), and its answer is returned as the owner gave it.
//!
//! A forwarded request carries [`FORWARDED`] and is never forwarded again:
//! two nodes whose copies of the members disagree for a moment answer 503
//! (the engine's "owned by" error), which the client retries, instead of
//! sending it back and forth.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::FrontError;
use crate::cluster::owners::Owner;

/// Marks a request one node forwarded to another (its value: the sender).
pub const FORWARDED: &str = "x-freqcap-forwarded";

/// On an answer the owner gave through another node: the owner's
/// `host:port`.
pub const OWNER: &str = "x-freqcap-owner";

/// How long a forwarded request may take, connection included: an owner
/// that does not answer in this is treated as gone (503, retried).
const TIMEOUT: Duration = Duration::from_secs(5);

/// Largest answer taken back from an owner (answers are a few KB: a screen
/// of 1 000 candidates is ~60 KB).
const MAX_ANSWER: usize = 4 << 20;

/// The headers an owner's answer keeps (rate-limit headers, retry hints).
const KEPT: [&str; 6] = [
    "content-type",
    "retry-after",
    "ratelimit",
    "ratelimit-policy",
    "x-request-id",
    "www-authenticate",
];

/// A pooled HTTP/1.1 client to the other nodes, over TLS when the nodes
/// serve TLS (`tls_peer_ca`).
pub struct Forwarder {
    pool: Pool,
    node: HeaderValue,
}

enum Pool {
    Plain(Client<HttpConnector, Full<Bytes>>),
    Tls(Client<HttpsConnector<HttpConnector>, Full<Bytes>>),
}

impl Forwarder {
    /// `tls`: the client configuration of TLS between nodes
    /// (`crate::tls::peer_client`); `None`: plaintext.
    pub fn new(node: &str, tls: Option<Arc<rustls::ClientConfig>>) -> Forwarder {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(TIMEOUT));
        let mut builder = Client::builder(TokioExecutor::new());
        builder.pool_idle_timeout(Duration::from_secs(30));
        let pool = match tls {
            None => Pool::Plain(builder.build(connector)),
            Some(config) => {
                connector.enforce_http(false);
                let https = HttpsConnectorBuilder::new()
                    .with_tls_config((*config).clone())
                    .https_only()
                    .enable_http1()
                    .wrap_connector(connector);
                Pool::Tls(builder.build(https))
            }
        };
        Forwarder {
            pool,
            node: HeaderValue::from_str(node).unwrap_or(HeaderValue::from_static("node")),
        }
    }

    /// Sends the request to `owner` if it is another node and the request
    /// was not forwarded already; `None`: decide it here.
    pub async fn to_owner(
        &self,
        owner: Option<Owner>,
        method: Method,
        path: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Option<Result<Response, FrontError>> {
        let Some(Owner::Other { node, addr }) = owner else {
            return None;
        };
        if headers.contains_key(FORWARDED) {
            return None;
        }
        Some(self.send(&node, &addr, method, path, headers, body).await)
    }

    fn scheme(&self) -> &'static str {
        match self.pool {
            Pool::Plain(_) => "http",
            Pool::Tls(_) => "https",
        }
    }

    async fn send(
        &self,
        node: &str,
        addr: &str,
        method: Method,
        path: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response, FrontError> {
        let gone = |why: String| {
            FrontError::unavailable(format!(
                "this user's owner, node {node} ({addr}), cannot be reached: {why}; retry"
            ))
        };
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}://{addr}{path}", self.scheme()))
            .header(header::CONTENT_TYPE, "application/json")
            .header(HeaderName::from_static(FORWARDED), self.node.clone());
        // The client's `Host` too: the owner checks it as the node asked
        // did (`allowed_hosts`, the same across a fleet), where the owner's
        // own address might not be allowed.
        for h in [
            header::HOST,
            header::AUTHORIZATION,
            HeaderName::from_static("x-request-id"),
            // The request's class may come as a header only: the owner
            // decides at the class the node asked was sent.
            HeaderName::from_static(super::priority::HEADER),
        ] {
            if let Some(v) = headers.get(&h) {
                req = req.header(h, v.clone());
            }
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| FrontError::internal(format_args!("forwarded request: {e}")))?;
        let answer = tokio::time::timeout(TIMEOUT, async {
            let res = match &self.pool {
                Pool::Plain(c) => c.request(req).await,
                Pool::Tls(c) => c.request(req).await,
            }
            .map_err(|e| gone(e.to_string()))?;
            let (parts, body) = res.into_parts();
            let bytes = Limited::new(body, MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| gone(format!("its answer could not be read: {e}")))?
                .to_bytes();
            Ok::<_, FrontError>((parts, bytes))
        })
        .await
        .map_err(|_| gone(format!("no answer in {} s", TIMEOUT.as_secs())))??;
        let (parts, bytes) = answer;
        let mut out = Response::new(Body::from(bytes));
        *out.status_mut() = StatusCode::from_u16(parts.status.as_u16())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        for name in KEPT {
            for v in parts.headers.get_all(name) {
                out.headers_mut().append(name, v.clone());
            }
        }
        // Where the user lives: a client or load balancer that sends the
        // user's next requests there saves this hop.
        if let Ok(v) = HeaderValue::from_str(addr) {
            out.headers_mut().insert(HeaderName::from_static(OWNER), v);
        }
        Ok(out.into_response())
    }
}
