//! Where gRPC enters (docs/grpc.md): `freqcap.v1.Freqcap` and
//! `freqcap.v1.Admin` on `grpc_listen`, with gRPC health checking and
//! reflection. A thin translation like the HTTP and RESP fronts: [`convert`]
//! maps messages to engine requests and back, [`freqcap`] and [`admin`] call
//! the engine; the tokens, the in-flight cap and the
//! metrics are HTTP's own ([`AppState`]).

pub mod admin;
pub mod convert;
pub mod freqcap;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::{Request, Status};

use crate::api::{ApiError, AppState};
use crate::clock::Clock;

/// The messages and services generated from `schemas/freqcap/v1/freqcap.proto`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("freqcap.v1");

    /// The compiled schemas, for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/freqcap_descriptor.bin"));
}

/// An API error as a gRPC status (docs/grpc.md, "Status codes"): the API's
/// code leads the message, so clients see the same words as over HTTP.
pub fn status(e: ApiError) -> Status {
    use tonic::Code;
    let code = match e.code {
        "invalid_argument" => Code::InvalidArgument,
        "not_found" => Code::NotFound,
        "conflict" => Code::Aborted,
        "unauthenticated" => Code::Unauthenticated,
        "forbidden" => Code::PermissionDenied,
        "too_large" => Code::ResourceExhausted,
        "overloaded" | "unavailable" => Code::Unavailable,
        "request_timeout" => Code::DeadlineExceeded,
        _ => Code::Internal,
    };
    let mut s = Status::new(code, format!("{}: {}", e.code, e.message));
    if code == Code::Unavailable {
        // gRPC's retry pushback: try again in a second, as HTTP's
        // `Retry-After: 1`.
        s.metadata_mut().insert(
            "grpc-retry-pushback-ms",
            tonic::metadata::MetadataValue::from_static("1000"),
        );
    }
    s
}

/// The bearer-token check of every call: the decision or the admin token in
/// the `authorization` metadata, as `Bearer <token>`.
#[derive(Clone)]
pub struct Auth {
    tokens: Arc<[String]>,
}

impl Auth {
    pub fn new(decision: Option<String>, admin: Option<String>) -> Auth {
        Auth {
            tokens: decision.into_iter().chain(admin).collect(),
        }
    }

    pub fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        if self.tokens.is_empty() {
            return Ok(());
        }
        let got = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim().as_bytes());
        match got {
            Some(t)
                if self
                    .tokens
                    .iter()
                    .any(|w| crate::api::guard::token_matches(t, w)) =>
            {
                Ok(())
            }
            _ => Err(Status::unauthenticated(
                "unauthenticated: a valid bearer token is required (authorization: Bearer <token>)",
            )),
        }
    }
}

/// Limits of the gRPC listener (docs/grpc.md, "Tokens, limits, probes").
#[derive(Debug, Clone, Copy)]
pub struct GrpcOptions {
    /// Connections at once; past it a connection is closed at accept.
    pub max_connections: usize,
    /// The longest a call may take, its messages' sending included: a client
    /// that trickles a message in holds a stream no longer than this.
    pub request_timeout: Duration,
    /// How long a new connection may stay silent before its first bytes
    /// (HTTP/2's preface): silent sockets cannot hold every place.
    pub handshake_timeout: Duration,
}

/// A connection holding its place under `grpc_max_connections`, given back
/// when tonic drops the connection.
struct Capped {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    open: Gauge,
}

impl Drop for Capped {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl AsyncRead for Capped {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Capped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Connected for Capped {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

/// The connections tonic serves: accepted here, each holding a place under
/// the cap or closed at once (counted as refused). Ends when tonic stops
/// taking connections (shutdown).
fn capped_incoming(
    listener: TcpListener,
    max: usize,
    handshake: Duration,
    counters: crate::api::metrics::ConnCounters,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<Capped>> {
    let (tx, rx) = mpsc::channel(16);
    let places = Arc::new(Semaphore::new(max.max(1)));
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                s = crate::server::accept(&listener) => s,
                _ = tx.closed() => break,
            };
            let Some(stream) = stream else { continue };
            let Ok(permit) = places.clone().try_acquire_owned() else {
                counters.refused.inc();
                drop(stream);
                continue;
            };
            // Small answers go out at once (no Nagle delay), as HTTP's and
            // RESP's connections do.
            let _ = stream.set_nodelay(true);
            counters.open.inc();
            let conn = Capped {
                stream,
                _permit: permit,
                open: counters.open.clone(),
            };
            // Handed to tonic once it has sent something; a connection
            // silent past the handshake timeout is closed (its place freed).
            let (tx, timed_out) = (tx.clone(), counters.timed_out.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(handshake, conn.stream.readable()).await {
                    Ok(Ok(())) => {
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(_)) => {}
                    Err(_) => {
                        timed_out.inc();
                    }
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Serves gRPC on `listener` until `shutdown` resolves.
pub async fn serve<C: Clock + 'static>(
    listener: TcpListener,
    state: Arc<AppState<C>>,
    rls: Option<Arc<crate::rls::RulesHandle>>,
    options: GrpcOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), String> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<pb::freqcap_server::FreqcapServer<freqcap::Service<C>>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| e.to_string())?;
    let max = state.options.max_body;
    health
        .set_serving::<pb::admin_server::AdminServer<admin::Service<C>>>()
        .await;
    let admin = pb::admin_server::AdminServer::new(admin::Service::new(state.clone()))
        .max_decoding_message_size(max);
    // Envoy's rate limit service, when rules are configured (src/rls/).
    let rls = match rls {
        Some(rules) => {
            type Rls<C> = crate::rls::pb::rate_limit_service_server::RateLimitServiceServer<
                crate::rls::service::Service<C>,
            >;
            health.set_serving::<Rls<C>>().await;
            Some(
                Rls::new(crate::rls::service::Service::new(state.clone(), rules))
                    .max_decoding_message_size(max),
            )
        }
        None => None,
    };
    let incoming = capped_incoming(
        listener,
        options.max_connections,
        options.handshake_timeout,
        state.metrics.grpc_connections.clone(),
    );
    let service = pb::freqcap_server::FreqcapServer::new(freqcap::Service::new(state))
        .max_decoding_message_size(max);
    tonic::transport::Server::builder()
        // As the HTTP port's HTTP/2 (src/server.rs): streams per connection,
        // and pings that close connections whose peer went away.
        .max_concurrent_streams(256)
        .timeout(options.request_timeout)
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(service)
        .add_service(admin)
        .add_optional_service(rls)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| e.to_string())
}
