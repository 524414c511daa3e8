//! `freqcap serve`: configuration (file, environment, flags) and the server's
//! life — open the store, serve HTTP, sweep, shut down cleanly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::api::{self, ApiOptions};
use crate::clock::SystemClock;
use crate::engine::{Engine, EngineOptions};
use crate::store::{Durability, MemoryStore, RocksOptions, RocksStore, Store};

/// Every option of the service. The TOML file uses these names; each has a
/// `FREQCAP_<NAME>` environment variable and a `--<name>` flag (flags win over
/// the environment, which wins over the file). `ops/freqcap.toml` documents
/// each.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServeConfig {
    /// Address to listen on; port 0 picks a free one (the log says which).
    pub listen: SocketAddr,
    /// RocksDB directory.
    pub data_dir: PathBuf,
    /// Keep everything in memory (nothing survives a restart).
    pub memory: bool,
    pub durability: Durability,
    /// Bytes the hot tier may use.
    pub memory_budget: usize,
    /// Largest request body, bytes.
    pub max_body: usize,
    /// Most candidates per screen.
    pub max_candidates: usize,
    /// Longest key, user, campaign or event id, bytes.
    pub max_id_len: usize,
    /// Requests handled at once before answering 503.
    pub max_in_flight: usize,
    /// How long event ids are remembered, seconds.
    pub dedupe_horizon_secs: u64,
    /// How long an idle record stays in memory, seconds.
    pub idle_grace_secs: u64,
    /// Open reservations at once; a reserving request past it gets 503.
    pub max_open_reservations: usize,
    /// RocksDB's block cache, bytes (shared by every column family).
    pub block_cache_bytes: usize,
    /// RocksDB memtable size of the state and dedupe column families, bytes.
    pub write_buffer_bytes: usize,
    /// Total size of RocksDB's write-ahead log files, bytes.
    pub max_wal_bytes: u64,
    /// Bearer token for decision endpoints (unset: open).
    pub decision_token: Option<String>,
    /// Bearer token for definitions and admin endpoints (unset: open).
    pub admin_token: Option<String>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        let e = EngineOptions::default();
        let a = ApiOptions::default();
        let r = RocksOptions::default();
        ServeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: PathBuf::from("./freqcap-data"),
            memory: false,
            durability: Durability::Wal,
            memory_budget: e.memory_budget,
            max_body: a.max_body,
            max_candidates: e.max_candidates,
            max_id_len: e.max_id_len,
            max_in_flight: a.max_in_flight,
            dedupe_horizon_secs: e.dedupe_horizon / 1_000_000_000,
            idle_grace_secs: e.idle_grace / 1_000_000_000,
            max_open_reservations: e.max_open_reservations,
            block_cache_bytes: r.block_cache_bytes,
            write_buffer_bytes: r.write_buffer_bytes,
            max_wal_bytes: r.max_wal_bytes,
            decision_token: None,
            admin_token: None,
        }
    }
}

impl ServeConfig {
    /// Reads a TOML file; errors name the field.
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        crate::model::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// Waits for SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Runs the service until SIGTERM/SIGINT: stops accepting, drains requests in
/// flight, then flushes the writer.
pub async fn serve(config: ServeConfig) -> Result<(), String> {
    let store: Arc<dyn Store> = if config.memory {
        Arc::new(MemoryStore::new())
    } else {
        let sizes = RocksOptions {
            block_cache_bytes: config.block_cache_bytes,
            write_buffer_bytes: config.write_buffer_bytes,
            max_wal_bytes: config.max_wal_bytes,
        };
        Arc::new(
            RocksStore::open_with(&config.data_dir, config.durability, sizes)
                .map_err(|e| e.to_string())?,
        )
    };
    let options = EngineOptions {
        memory_budget: config.memory_budget,
        max_candidates: config.max_candidates,
        max_id_len: config.max_id_len,
        dedupe_horizon: config.dedupe_horizon_secs.saturating_mul(1_000_000_000),
        idle_grace: config.idle_grace_secs.saturating_mul(1_000_000_000),
        max_open_reservations: config.max_open_reservations,
        ..EngineOptions::default()
    };
    let engine =
        Arc::new(Engine::open(store, SystemClock::new(), options).map_err(|e| e.to_string())?);
    let app = api::router(
        engine.clone(),
        ApiOptions {
            max_body: config.max_body,
            max_in_flight: config.max_in_flight,
            decision_token: config.decision_token.clone(),
            admin_token: config.admin_token.clone(),
            sleep_on_wait: true,
        },
    );
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(%addr, data_dir = %config.data_dir.display(), memory = config.memory, "freqcap listening on {addr}");
    // Expire reservations and drop idle records even when no request comes.
    let sweeper = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let e = engine.clone();
                let _ = tokio::task::spawn_blocking(move || e.sweep()).await;
            }
        })
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| format!("server failed: {e}"))?;
    sweeper.abort();
    tracing::info!("draining done; flushing the writer");
    engine.flush().map_err(|e| e.to_string())?;
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ServeConfig, String> {
        crate::model::from_toml(text).map_err(|e| e.to_string())
    }

    /// The commented example in ops/ is valid and states the defaults (only
    /// the data directory differs: a system path there).
    #[test]
    fn the_example_config_parses_and_states_the_defaults() {
        let text = include_str!("../ops/freqcap.toml");
        let c = parse(text).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/freqcap/data"));
        let defaults = ServeConfig {
            data_dir: c.data_dir.clone(),
            ..ServeConfig::default()
        };
        assert_eq!(c, defaults);
    }

    #[test]
    fn a_config_file_sets_what_it_names_and_keeps_the_defaults() {
        let c = parse("listen = \"127.0.0.1:9090\"\ndurability = \"fsync\"\n").unwrap();
        assert_eq!(c.listen, SocketAddr::from(([127, 0, 0, 1], 9090)));
        assert_eq!(c.durability, Durability::Fsync);
        assert_eq!(c.max_body, ServeConfig::default().max_body);
    }

    #[test]
    fn bad_config_names_the_field() {
        let e = parse("max_bodyy = 5\n").unwrap_err();
        assert!(e.contains("max_bodyy"), "{e}");
        let e = parse("durability = \"sometimes\"\n").unwrap_err();
        assert!(e.starts_with("durability"), "{e}");
        let e = parse("listen = \"nowhere\"\n").unwrap_err();
        assert!(e.starts_with("listen"), "{e}");
        let e = parse("idle_grace_secs = -1\n").unwrap_err();
        assert!(e.starts_with("idle_grace_secs"), "{e}");
    }
}
