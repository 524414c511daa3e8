//! Where Envoy's rate limit service enters (docs/rls.md):
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` on the gRPC
//! listener, so Envoy, Istio and Envoy Gateway can point at freqcap.
//!
//! - [`config`]: envoyproxy/ratelimit's YAML rules from `rls_config`,
//!   validated whole ([`config::Rules`]).
//! - [`matching`]: which rule a descriptor matches.
//! - [`service`]: the call, a thin translation onto the engine's
//!   all-or-nothing [`crate::engine::Engine::check_all`].
//!
//! [`RulesHandle`] holds the rules in force; a reload (SIGHUP) swaps them
//! whole, or keeps them whole when a file is bad.

pub mod config;
pub mod matching;
pub mod service;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::front::metrics::RlsCounters;
use config::{ConfigError, Rules};

/// The messages and service generated from the vendored subset of Envoy's
/// protos (`schemas/envoy/`), in modules named as their packages (the
/// generated code refers to its neighbours by those paths).
#[allow(clippy::all, missing_docs)]
pub mod pb {
    pub mod envoy {
        pub mod service {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.service.ratelimit.v3");
                }
            }
        }
        pub mod extensions {
            pub mod common {
                pub mod ratelimit {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                    }
                }
            }
        }
        pub mod config {
            pub mod core {
                pub mod v3 {
                    tonic::include_proto!("envoy.config.core.v3");
                }
            }
        }
        pub mod r#type {
            pub mod v3 {
                tonic::include_proto!("envoy.r#type.v3");
            }
        }
    }
    pub use envoy::config::core::v3::HeaderValue;
    pub use envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor,
    };
    pub use envoy::service::ratelimit::v3::*;
}

/// The rules in force and where they come from.
pub struct RulesHandle {
    dir: PathBuf,
    current: RwLock<Arc<Rules>>,
    counters: RlsCounters,
}

impl RulesHandle {
    /// Loads `dir`; an error names the file and the path inside it.
    pub fn open(dir: &Path, counters: RlsCounters) -> Result<RulesHandle, ConfigError> {
        let rules = Rules::load_dir(dir)?;
        counters.rules.set(rules.count as i64);
        Ok(RulesHandle {
            dir: dir.to_owned(),
            current: RwLock::new(Arc::new(rules)),
            counters,
        })
    }

    /// The rules in force (a clone of an `Arc`: a reload never changes the
    /// rules a call is being decided by).
    pub fn current(&self) -> Arc<Rules> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Reads the directory again and applies it whole, or, if any file is
    /// bad, keeps the rules in force and returns the error (docs/rls.md,
    /// "Reloading").
    pub fn reload(&self) -> Result<usize, ConfigError> {
        match Rules::load_dir(&self.dir) {
            Ok(rules) => {
                let n = rules.count;
                *self
                    .current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(rules);
                self.counters.rules.set(n as i64);
                self.counters.reloads.inc();
                Ok(n)
            }
            Err(e) => {
                self.counters.reload_failures.inc();
                Err(e)
            }
        }
    }

    /// Reloads on every SIGHUP, logging what happened, until the process
    /// ends. SIGHUP is listened for from this call on, not from the
    /// future's first poll: called before the listeners start, a signal
    /// sent as soon as the service answers is not missed (a test sending
    /// one right after its first answer saw it missed once in a full test
    /// run when the task registered it on its first poll).
    pub fn reload_on_sighup(self: Arc<Self>) -> impl std::future::Future<Output = ()> + Send {
        #[cfg(unix)]
        let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        async move {
            #[cfg(unix)]
            {
                let Ok(mut hup) = hup else {
                    tracing::warn!("cannot listen for SIGHUP: rls_config is not reloaded");
                    return;
                };
                while hup.recv().await.is_some() {
                    let me = self.clone();
                    match tokio::task::spawn_blocking(move || me.reload()).await {
                        Ok(Ok(n)) => tracing::info!(
                            rules = n,
                            dir = %self.dir.display(),
                            "rls_config reloaded: {n} rules"
                        ),
                        Ok(Err(e)) => tracing::error!(
                            dir = %self.dir.display(),
                            "rls_config not reloaded, the previous rules stay: {e}"
                        ),
                        Err(e) => tracing::error!("rls_config reload failed: {e}"),
                    }
                }
            }
        }
    }
}
