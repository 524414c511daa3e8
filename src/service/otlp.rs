//! Spans exported over OTLP/HTTP (protobuf) to a collector (feature
//! `otlp`; docs/service.md, "Tracing"): the spans of target
//! `freqcap::trace` (`src/front/trace.rs`), batched on the exporter's own
//! thread, so a slow or absent collector never holds a request.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;

/// Flushes the spans still batched when dropped (at exit).
pub struct Exporter(SdkTracerProvider);

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Err(e) = self.0.shutdown() {
            eprintln!("freqcap: spans not all exported at exit: {e}");
        }
    }
}

/// The layer exporting freqcap's spans to `endpoint` (`http://HOST:4318`;
/// `/v1/traces` added when it has no path), and what flushes it at exit.
/// `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT` and
/// `OTEL_BSP_*` apply as the OpenTelemetry specification says.
pub fn layer<S>(endpoint: &str, node: Option<&str>) -> Result<(impl Layer<S>, Exporter), String>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let url = match endpoint.split_once("://") {
        Some((_, rest)) if !rest.trim_end_matches('/').contains('/') => {
            format!("{}/v1/traces", endpoint.trim_end_matches('/'))
        }
        Some(_) => endpoint.to_owned(),
        None => {
            return Err(format!(
                "otlp_endpoint: expected http://HOST:PORT (OTLP/HTTP, usually port 4318), got {endpoint:?}"
            ));
        }
    };
    let exporter = SpanExporter::builder()
        .with_http()
        .with_endpoint(url)
        .build()
        .map_err(|e| format!("otlp_endpoint: {e}"))?;
    let mut resource = Resource::builder().with_service_name("freqcap");
    if let Some(n) = node {
        resource = resource.with_attribute(opentelemetry::KeyValue::new(
            "service.instance.id",
            n.to_owned(),
        ));
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("freqcap");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(Targets::new().with_target(crate::front::trace::TARGET, tracing::Level::INFO));
    Ok((layer, Exporter(provider)))
}
