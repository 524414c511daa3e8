//! `freqcap serve`: configuration (file, environment, flags) and the server's
//! life — open the store, serve HTTP, sweep, shut down cleanly.
//!
//! - `config.rs`: [`ServeConfig`] and [`LogFormat`], their defaults, and the
//!   checks that refuse or warn about a configuration at start;
//! - `run.rs`: [`serve`], the server's life as named steps in order (store,
//!   engine, definitions, listeners, fleet, sweeper, shutdown).

mod config;
mod run;

pub use config::{LogFormat, MIN_TOKEN_CHARS, ServeConfig};
pub use run::serve;
