//! `freqcap serve`: configuration (file, environment, flags) and the server's
//! life — open the store, serve HTTP, sweep, shut down cleanly.
//!
//! - `config.rs`: [`ServeConfig`] and [`LogFormat`], their defaults, and the
//!   checks that refuse or warn about a configuration at start;
//! - `run.rs`: [`serve`], the server's life as named steps in order (store,
//!   engine, definitions, listeners, fleet, sweeper, shutdown).

//! - `logs.rs`: where log lines and spans go;
//! - `otlp.rs` (feature `otlp`): spans exported to a collector.

mod config;
mod logs;
#[cfg(feature = "otlp")]
mod otlp;
mod run;

pub use config::{LogFormat, MIN_TOKEN_CHARS, ServeConfig};
pub use logs::{LogGuard, init as init_logs};
pub use run::serve;
