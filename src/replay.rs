//! `freqcap replay`: the HTTP API on a virtual clock (docs/semantics.md §9).
//!
//! Each input line is one request at a stated time; each output line is its
//! answer. The requests go through the very router `freqcap serve` uses,
//! in-process (no sockets), against an engine whose clock is a
//! [`ManualClock`] set to the line's `at_ms` before the request is handled.
//! Reservations therefore expire by the virtual clock, and the same input
//! gives the same output, byte for byte: made reservation ids use a fixed
//! nonce and `"wait": true` never sleeps.

use std::io::{BufRead, Write};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, header};
use serde::Deserialize;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::api;
use crate::clock::{ManualClock, Nanos};
use crate::engine::{Engine, EngineOptions};
use crate::front::FrontOptions;
use crate::store::Store;

/// One input line as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    at_ms: u64,
    method: String,
    path: String,
    #[serde(default)]
    body: Option<Value>,
}

/// What a replay did, for the command's closing log line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Lines answered (every input line is answered once).
    pub lines: u64,
    /// Lines answered with a status of 400 or more, including unreadable ones.
    pub errors: u64,
}

/// The nonce of made reservation ids in replay: fixed, so that made ids, and
/// so whole answers, repeat from one run to the next.
const REPLAY_ID_NONCE: u32 = 0;

/// A replay session: an engine on a virtual clock behind the service's router.
pub struct Replayer {
    clock: Arc<ManualClock>,
    router: Router,
    /// The clock of the last line accepted, in ms; a line before it is a 400.
    last_ms: Option<u64>,
    runtime: tokio::runtime::Runtime,
}

impl Replayer {
    /// Opens the engine on `store` at virtual time 0 (the first line sets the
    /// clock before anything is decided) with `options`, except that made
    /// reservation ids get a fixed nonce unless `options` names one.
    pub fn new(
        store: Arc<dyn Store>,
        options: EngineOptions,
        api_options: FrontOptions,
    ) -> Result<Self, String> {
        let clock = Arc::new(ManualClock::new(0));
        let options = EngineOptions {
            id_nonce: Some(options.id_nonce.unwrap_or(REPLAY_ID_NONCE)),
            ..options
        };
        let engine = Engine::open(store, clock.clone(), options).map_err(|e| e.to_string())?;
        let router = api::router(
            Arc::new(engine),
            FrontOptions {
                sleep_on_wait: false,
                ..api_options
            },
        );
        // One thread: lines are handled one after another, so nothing about
        // their order is left to a scheduler.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the runtime: {e}"))?;
        Ok(Replayer {
            clock,
            router,
            last_ms: None,
            runtime,
        })
    }

    /// Answers one input line with one output value `{"at_ms", "status", "body"}`.
    pub fn line(&mut self, text: &str) -> Value {
        let line: Line = match crate::model::from_json(text) {
            Ok(l) => l,
            Err(e) => {
                // Say when it was if the line got that far, else the clock as is.
                let at = serde_json::from_str::<Value>(text)
                    .ok()
                    .and_then(|v| v.get("at_ms").and_then(Value::as_u64))
                    .or(self.last_ms);
                return error_line(at, &e.to_string());
            }
        };
        if let Some(last) = self.last_ms
            && line.at_ms < last
        {
            return error_line(
                Some(line.at_ms),
                &format!("at_ms: {} is before the previous line's {last}", line.at_ms),
            );
        }
        let Some(now) = line.at_ms.checked_mul(1_000_000) else {
            return error_line(Some(line.at_ms), "at_ms: too large");
        };
        let Ok(method) = Method::from_bytes(line.method.as_bytes()) else {
            return error_line(Some(line.at_ms), "method: not an HTTP method");
        };
        if !line.path.starts_with('/') {
            return error_line(Some(line.at_ms), "path: must start with /");
        }
        self.last_ms = Some(line.at_ms);
        self.clock.set(now as Nanos);
        let body = match &line.body {
            None | Some(Value::Null) => Body::empty(),
            Some(v) => Body::from(v.to_string()),
        };
        let request = match Request::builder()
            .method(method)
            .uri(&line.path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
        {
            Ok(r) => r,
            Err(e) => return error_line(Some(line.at_ms), &format!("path: {e}")),
        };
        let router = self.router.clone();
        let (status, bytes) = self.runtime.block_on(async move {
            // The router's error type is `Infallible`.
            let response = match router.oneshot(request).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            let status = response.status().as_u16();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await;
            (status, bytes)
        });
        let body = match bytes {
            Ok(b) if b.is_empty() => Value::Null,
            Ok(b) => serde_json::from_slice(&b)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&b).into_owned())),
            Err(e) => json!({"error": {"code": "internal", "message": e.to_string()}}),
        };
        json!({"at_ms": line.at_ms, "status": status, "body": body})
    }

    /// Replays every line of `input` into `output`, exactly one answer per
    /// line (a blank line is not JSON: 400); only I/O errors stop it.
    pub fn run(&mut self, input: impl BufRead, mut output: impl Write) -> std::io::Result<Summary> {
        let mut summary = Summary::default();
        for text in input.lines() {
            let text = text?;
            let answer = self.line(&text);
            summary.lines += 1;
            if answer["status"].as_u64().unwrap_or(500) >= 400 {
                summary.errors += 1;
            }
            serde_json::to_writer(&mut output, &answer)?;
            output.write_all(b"\n")?;
        }
        output.flush()?;
        Ok(summary)
    }
}

/// A 400 answer for a line that could not be replayed; the clock is unchanged.
fn error_line(at_ms: Option<u64>, message: &str) -> Value {
    json!({
        "at_ms": at_ms,
        "status": 400,
        "body": {"error": {"code": "invalid_argument", "message": message}},
    })
}
