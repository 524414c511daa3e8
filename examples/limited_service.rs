//! An axum service limited by freqcap's tower layer (docs/clients.md): 5
//! requests per second per client IP, bursts of 10, answered 429 with the
//! IETF `RateLimit` fields and `Retry-After` past that.
//!
//! ```sh
//! cargo run --release --features tower --example limited_service
//! curl -i http://127.0.0.1:3000/
//! ```

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use freqcap::model::from_json;
use freqcap::tower::{PeerIp, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = from_json(
        r#"{"limits": [{"kind": "rate", "rate": 5, "per": "1s", "burst": 10, "name": "per-ip"}]}"#,
    )?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::local(&policy, PeerIp)?);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://127.0.0.1:3000");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
