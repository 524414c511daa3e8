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
//! How a call flows: the gRPC listener (`src/grpc/mod.rs`) refuses a
//! message over `max_body`, and its guard (`src/grpc/guard.rs`) checks the
//! token and sheds on queueing delay, all before the message is decoded.
//! [`service::Service`] then takes an in-flight slot, reads the rules in
//! force ([`RulesHandle::current`]), walks each descriptor to its rule
//! ([`matching::find`]) and decides every limited descriptor in one engine
//! step. Its answer, or its error status, is Envoy's to act on (docs/rls.md,
//! "Answers" and "Errors").
//!
//! [`RulesHandle`] holds the rules in force; a reload (SIGHUP) swaps them
//! whole, or keeps them whole when a file is bad. The rules are read at
//! start too: a bad directory then stops `freqcap serve`
//! (`src/service/run.rs`), since there are no rules in force to keep.

pub mod config;
pub mod matching;
pub mod series;
pub mod service;
pub mod wire;

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
        // The call: its request, its response and the server trait.
        pub mod service {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.service.ratelimit.v3");
                }
            }
        }
        // `RateLimitDescriptor`: entries, `limit` override, `hits_addend`.
        pub mod extensions {
            pub mod common {
                pub mod ratelimit {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                    }
                }
            }
        }
        // `HeaderValue`, of `response_headers_to_add` (the header fields).
        pub mod config {
            pub mod core {
                pub mod v3 {
                    tonic::include_proto!("envoy.config.core.v3");
                }
            }
        }
        // `RateLimitUnit`, of a `limit` override (no week: `service.rs`).
        pub mod r#type {
            pub mod v3 {
                tonic::include_proto!("envoy.r#type.v3");
            }
        }
    }
    // Short paths for what `service.rs` names.
    pub use envoy::config::core::v3::HeaderValue;
    pub use envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor,
    };
    pub use envoy::service::ratelimit::v3::*;
}

/// The rules in force and where they come from: read by the gRPC service
/// per call, swapped by the SIGHUP task.
/// What `ShouldRateLimit` answers a domain with no rules
/// (`rls_unknown_domain`, docs/rls.md "Errors").
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum UnknownDomain {
    /// INVALID_ARGUMENT naming `domain`: a typo in Envoy's `domain` shows
    /// (and, under Envoy's `failure_mode_deny`, denies).
    #[default]
    Error,
    /// OK with every descriptor OK, as envoyproxy/ratelimit answers:
    /// nothing is limited or debited; counted in
    /// `freqcap_rls_unknown_domain_total`.
    Ok,
}

pub struct RulesHandle {
    /// What a call naming a domain with no rules is answered
    /// (`rls_unknown_domain`).
    pub unknown_domain: UnknownDomain,
    /// The `rls_config` directory. It is listed again at every reload, so a
    /// file added or removed since the start is picked up.
    dir: PathBuf,
    /// An `Arc` behind a lock: a call holds the lock only to clone it, a
    /// reload only to swap it, so neither waits on parsing or deciding.
    current: RwLock<Arc<Rules>>,
    /// `freqcap_rls_*` (docs/rls.md, "Metrics"): the rules gauge and the
    /// reload counts here, the call outcomes in [`service::Service`].
    counters: RlsCounters,
}

impl RulesHandle {
    /// Loads `dir`; an error names the file and the path inside it. Used
    /// at start, where an error stops the server (there is nothing to keep).
    pub fn open(
        dir: &Path,
        counters: RlsCounters,
        unknown_domain: UnknownDomain,
        rule_metrics: bool,
    ) -> Result<RulesHandle, ConfigError> {
        let rules = Rules::load_dir(dir)?;
        counters.rules.set(rules.count as i64);
        counters.series.enable(rule_metrics);
        Ok(RulesHandle {
            unknown_domain,
            dir: dir.to_owned(),
            current: RwLock::new(Arc::new(rules)),
            counters,
        })
    }

    /// The rules in force (a clone of an `Arc`: a reload never changes the
    /// rules a call is being decided by).
    pub fn current(&self) -> Arc<Rules> {
        // A poisoned lock still holds whole rules: the only write is one
        // assignment of an `Arc`, which cannot stop half way.
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Reads the directory again and applies it whole, or, if any file is
    /// bad, keeps the rules in force and returns the error (docs/rls.md,
    /// "Reloading").
    pub fn reload(&self) -> Result<usize, ConfigError> {
        // Parsed before the lock is taken: calls keep reading the old rules
        // while the files are read and validated.
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
                    // Reading files (up to 4 MiB each) and parsing blocks:
                    // off the executor that decides calls.
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
                        // The reload's thread panicked or was cancelled: the
                        // rules in force stay.
                        Err(e) => tracing::error!("rls_config reload failed: {e}"),
                    }
                }
            }
        }
    }
}
