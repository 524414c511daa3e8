//! Where gRPC enters (docs/grpc.md): `freqcap.v1.Freqcap` and
//! `freqcap.v1.Admin` on `grpc_listen`, with gRPC health checking and
//! reflection. A thin translation like the HTTP and RESP fronts: [`convert`]
//! maps messages to engine requests and back, [`freqcap`] and [`admin`] call
//! the engine; the tokens, the in-flight cap, the body memory budget and the
//! metrics are HTTP's own ([`AppState`]).
//!
//! Connections are HTTP's too: accepted, capped, timed out and drained by
//! `src/server.rs` (HTTP/2 only here), and every call passes [`guard`]
//! before tonic sees its message. tonic's own server ran them before: a
//! silent socket was never closed, 50 of them locked out every client and
//! Envoy's RLS, and one held SIGTERM for as long as its peer liked
//! (security probe, cases 1.27–1.29).
//!
//! What gRPC costs over HTTP/1.1 JSON (BENCHMARKS.md, "gRPC against
//! HTTP/1.1", one run): a check on one key at 0.67× the ops/s, 24.9 µs of
//! server CPU per call against 17.1; screen(50) + commit at 0.75×. The
//! system calls are the same (one read, one write per call, since
//! `server.rs` gathers h2's writes); the extra ~8 µs is h2's frames and
//! HPACK, its stream states and hyper's task per stream, and tonic's router
//! inside axum's. So the fronts share everything above the wire format,
//! and nothing here does per-call work HTTP does not.

pub mod admin;
pub mod codec;
pub mod convert;
pub mod frames;
pub mod freqcap;
pub mod guard;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::clock::Clock;
use crate::front::AppState;
use crate::server::ConnLimits;

/// The messages and services generated from `schemas/freqcap/v1/freqcap.proto`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("freqcap.v1");

    /// The compiled schemas, for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/freqcap_descriptor.bin"));
}

/// Serves gRPC on `listener` until `shutdown` resolves, then drains, with
/// `limits` (HTTP/2 only; `src/server.rs`).
pub async fn serve<C: Clock + 'static>(
    listener: TcpListener,
    state: Arc<AppState<C>>,
    rls: Option<Arc<crate::rls::RulesHandle>>,
    limits: ConnLimits,
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
    let service = pb::freqcap_server::FreqcapServer::new(freqcap::Service::new(state.clone()))
        .max_decoding_message_size(max);
    let mut routes = tonic::service::Routes::new(health_service)
        .add_service(reflection)
        .add_service(service)
        .add_service(admin);
    // Envoy's rate limit service, when rules are configured (src/rls/).
    if let Some(rules) = rls {
        type Rls<C> = crate::rls::pb::rate_limit_service_server::RateLimitServiceServer<
            crate::rls::service::Service<C>,
        >;
        health.set_serving::<Rls<C>>().await;
        routes = routes.add_service(
            Rls::new(crate::rls::service::Service::new(state.clone(), rules))
                .max_decoding_message_size(max),
        );
    }
    let router = routes
        .prepare()
        .into_axum_router()
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::guard::<C>,
        ));
    let router = crate::front::trace::layer(router);
    let counters = state.metrics.grpc_connections.clone();
    crate::server::serve(listener, router, limits, counters, shutdown).await;
    Ok(())
}
