//! Where log lines and spans go: log lines to stderr (text or JSON, the
//! level from `FREQCAP_LOG`), spans to an OTLP collector when
//! `otlp_endpoint` is set (feature `otlp`). Each has its own filter: the
//! spans of `freqcap::trace` stay out of the log unless `FREQCAP_LOG` names
//! that target.

use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use super::{LogFormat, ServeConfig};

/// Keeps the exporter for the process's life; dropped at exit, it flushes.
pub struct LogGuard {
    #[cfg(feature = "otlp")]
    _otlp: Option<super::otlp::Exporter>,
}

/// Installs the process's subscriber.
pub fn init(config: &ServeConfig) -> Result<LogGuard, String> {
    let wanted = std::env::var("FREQCAP_LOG").unwrap_or_default();
    let mut filter = tracing_subscriber::EnvFilter::try_from_env("FREQCAP_LOG")
        .unwrap_or_else(|_| "info".into());
    if !wanted.contains(crate::front::trace::TARGET)
        && let Ok(off) = format!("{}=off", crate::front::trace::TARGET).parse()
    {
        filter = filter.add_directive(off);
    }
    let stderr = match config.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            // Colour codes only for a person at a terminal, not in journals.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let registry = tracing_subscriber::registry().with(stderr.with_filter(filter));
    #[cfg(feature = "otlp")]
    {
        // Without an endpoint the subscriber is the one a build without the
        // feature has: an absent layer (`Option<Layer>`) still made every
        // event go through per-layer filtering, and cost this build ~10 %
        // of check throughput with nothing exported (BENCHMARKS.md,
        // "Tracing").
        let Some(endpoint) = &config.otlp_endpoint else {
            registry.init();
            return Ok(LogGuard { _otlp: None });
        };
        let (layer, exporter) = super::otlp::layer(endpoint, config.node_id.as_deref())?;
        registry.with(layer).init();
        Ok(LogGuard {
            _otlp: Some(exporter),
        })
    }
    #[cfg(not(feature = "otlp"))]
    {
        if config.otlp_endpoint.is_some() {
            return Err(
                "otlp_endpoint: this build has no OTLP exporter (build with `--features otlp`)"
                    .into(),
            );
        }
        registry.init();
        Ok(LogGuard {})
    }
}
