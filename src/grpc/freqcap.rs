//! `freqcap.v1.Freqcap`: each call checks the token, takes an in-flight slot
//! (one counter with HTTP's), converts, and calls the engine as the HTTP
//! handler of the same endpoint does (on the executor when every record is
//! in memory, else on a blocking thread).

use std::sync::Arc;

use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::{convert, pb};
use crate::clock::Clock;
use crate::engine::{Engine, Priority};
use crate::front::AppState;
use crate::front::FrontError;
use crate::front::call::{blocking, commit_reservation, count_events, in_memory_or_blocking};
use crate::front::error::status;
use crate::front::outcome::{self, Checked};
use crate::front::shed::InFlight;
use crate::server::Conn;

/// RecordEvents counts its events in batches of this many.
const BATCH: usize = 512;

/// How much earlier than body_timeout RecordEvents ends a stream itself (a
/// tenth of the timeout, at most this): before tonic's own cut.
const MARGIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The call's `x-freqcap-priority` metadata, copied out so the request can
/// be consumed (docs/semantics.md §2.5).
fn priority_header<T>(req: &Request<T>) -> Option<Vec<u8>> {
    req.metadata()
        .get(crate::front::priority::HEADER)
        .map(|v| v.as_bytes().to_vec())
}

/// The service, over the state every front shares.
pub struct Service<C: Clock> {
    state: Arc<AppState<C>>,
}

impl<C: Clock + 'static> Service<C> {
    /// The service over the server's shared state (one per listener).
    pub fn new(state: Arc<AppState<C>>) -> Self {
        Service { state }
    }

    /// An in-flight slot for a call (its token was checked on its headers,
    /// src/grpc/guard.rs).
    async fn enter<T>(&self, req: &Request<T>) -> Result<InFlight<'_>, Status> {
        let class = crate::front::shed::claimed(req.metadata().as_ref());
        self.admit(req, class).await
    }

    /// A slot for a call of `class`, waiting for one as HTTP's requests do
    /// (`front::shed::admit`).
    async fn admit<T>(&self, req: &Request<T>, class: Priority) -> Result<InFlight<'_>, Status> {
        let s = &self.state;
        let waited = req
            .extensions()
            .get::<Conn>()
            .map(Conn::queue_delay)
            .unwrap_or_default();
        crate::front::shed::admit(&s.shed, &s.options, &s.metrics, class, waited)
            .await
            .map_err(status)
    }

    /// The slot of a commit or release: counted, never refused (settling
    /// is not shed, `front::shed::Work`).
    fn settle_slot(&self) -> InFlight<'_> {
        let s = &self.state;
        InFlight::enter_to_settle(&s.shed, &s.metrics, s.options.max_in_flight)
    }

    /// A slot for one batch of a stream, as a `default` call that waited
    /// nothing yet.
    async fn slot(&self) -> Result<InFlight<'_>, Status> {
        let s = &self.state;
        let class = Priority::Default;
        crate::front::shed::admit(&s.shed, &s.options, &s.metrics, class, Default::default())
            .await
            .map_err(status)
    }

    /// An id over the length limit is INVALID_ARGUMENT naming it, as HTTP's
    /// path parameters are.
    fn id(&self, field: &str, v: &str) -> Result<(), Status> {
        crate::front::call::id_param(&self.state, field, v).map_err(status)
    }

    /// RecordEvents' stream, counted in batches of [`BATCH`] as they
    /// arrive (so a long stream holds little) into `counted` and
    /// `duplicates`, until it ends, fails, or `deadline`.
    async fn record(
        &self,
        stream: &mut Streaming<pb::Event>,
        deadline: tokio::time::Instant,
        limit: std::time::Duration,
        counted: &mut u64,
        duplicates: &mut u64,
    ) -> Result<(), Status> {
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            let next = tokio::time::timeout_at(deadline, stream.next())
                .await
                .map_err(|_| {
                    Status::deadline_exceeded(format!(
                        "request_timeout: the stream did not end within {} ms",
                        limit.as_millis()
                    ))
                })?;
            let end = next.is_none();
            if let Some(e) = next {
                batch.push(convert::event(e?).map_err(status)?);
            }
            if (end && !batch.is_empty()) || batch.len() >= BATCH {
                let _slot = self.slot().await?;
                let n = self.count(std::mem::take(&mut batch)).await?;
                *counted += n.counted;
                *duplicates += n.duplicates;
            }
            if end {
                return Ok(());
            }
        }
    }

    /// Counts events for `Events` and each message of `EventStream`; an
    /// empty batch is INVALID_ARGUMENT naming `events`, as over HTTP
    /// (`front::call::count_events` holds the rule).
    async fn count(&self, events: Vec<crate::engine::Event>) -> Result<pb::EventsCounted, Status> {
        let n = events.len();
        let counted = count_events(&self.state, events).await.map_err(status)?;
        Ok(pb::EventsCounted {
            counted: counted as u64,
            duplicates: (n - counted) as u64,
        })
    }
}

#[tonic::async_trait]
impl<C: Clock + 'static> pb::freqcap_server::Freqcap for Service<C> {
    /// `Check`, as `POST /v1/check`: decided on the executor when the key's
    /// record is in memory, else on a blocking thread; counted under
    /// `grpc Check` with the outcome words of every front.
    async fn check(
        &self,
        req: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        let _slot = self.enter(&req).await?;
        let header = priority_header(&req);
        let r = convert::check(req.into_inner(), header.as_deref()).map_err(status)?;
        let out = in_memory_or_blocking(&self.state, r, Engine::check_in_memory, Engine::check)
            .await
            .map_err(status)?;
        self.state
            .metrics
            .decisions("grpc Check", Checked::of_check(&out).as_str(), 1);
        Ok(Response::new(convert::decision(&out)))
    }

    /// `Screen`, as `POST /v1/screen`: each candidate decided and, with
    /// `reserve`, held until the commit, the release or its ttl; counted per
    /// candidate.
    async fn screen(
        &self,
        req: Request<pb::ScreenRequest>,
    ) -> Result<Response<pb::ScreenResponse>, Status> {
        let _slot = self.enter(&req).await?;
        let header = priority_header(&req);
        let r = convert::screen(req.into_inner(), header.as_deref()).map_err(status)?;
        let out = in_memory_or_blocking(&self.state, r, Engine::screen_in_memory, Engine::screen)
            .await
            .map_err(status)?;
        for (outcome, n) in outcome::screened(&out.results) {
            self.state.metrics.decisions("grpc Screen", outcome, n);
        }
        Ok(Response::new(convert::screened(out)))
    }

    /// `Commit`, as `POST /v1/reservations/{id}/commit`: answered once the
    /// batch with the commit's writes is durable (docs/engine.md,
    /// "Durability"), awaited without parking a thread.
    async fn commit(
        &self,
        req: Request<pb::CommitRequest>,
    ) -> Result<Response<pb::Settled>, Status> {
        let _slot = self.settle_slot();
        let r = req.into_inner();
        self.id("reservation", &r.reservation)?;
        let c = convert::commit(&r).map_err(status)?;
        let out = commit_reservation(&self.state, r.reservation, c)
            .await
            .map_err(status)?;
        Ok(Response::new(convert::settled(out)))
    }

    /// `Release`: the reservation's holds given back; a repeat answers the
    /// same, a release of a committed id is a conflict (ABORTED).
    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::Settled>, Status> {
        let _slot = self.settle_slot();
        let r = req.into_inner();
        self.id("reservation", &r.reservation)?;
        let sample =
            crate::front::sample::of(r.latency_ms.map(|ms| ms as f64), r.outcome.as_deref())
                .map_err(status)?;
        let e = self.state.engine.clone();
        let out = blocking(move || e.release_with(&r.reservation, r.user.as_deref(), sample))
            .await
            .map_err(status)?;
        Ok(Response::new(convert::settled(out)))
    }

    /// `Events`: a batch counted at once, each event id once
    /// (`duplicates` says how many were repeats).
    async fn events(
        &self,
        req: Request<pb::EventsRequest>,
    ) -> Result<Response<pb::EventsCounted>, Status> {
        let _slot = self.enter(&req).await?;
        let evs = req
            .into_inner()
            .events
            .into_iter()
            .map(convert::event)
            .collect::<Result<Vec<_>, _>>()
            .map_err(status)?;
        Ok(Response::new(self.count(evs).await?))
    }

    /// `RecordEvents`: a client stream counted in batches as it arrives, so
    /// a long stream holds one batch; it ends before the body timeout so
    /// the client learns how many were applied (`freqcap-events-applied`
    /// metadata when it fails midway).
    async fn record_events(
        &self,
        req: Request<Streaming<pb::Event>>,
    ) -> Result<Response<pb::EventsCounted>, Status> {
        // The call may take body_timeout; past it tonic drops this future and
        // answers CANCELLED, which could not say what was counted. So the
        // stream is ended here a little earlier, and answered as any error.
        let limit = self.state.options.body_timeout;
        let deadline = tokio::time::Instant::now() + limit - (limit / 10).min(MARGIN);
        let mut stream = req.into_inner();
        let (mut counted, mut duplicates) = (0, 0);
        let result = self
            .record(&mut stream, deadline, limit, &mut counted, &mut duplicates)
            .await;
        if let Err(mut e) = result {
            // Events are applied in batches as they arrive: a stream that
            // fails part way has had its first `applied` events applied
            // (counted or found duplicate) and no others. A retry resends
            // the rest, or all with `event_id`s (docs/grpc.md).
            let m = e.metadata_mut();
            m.insert("freqcap-events-applied", (counted + duplicates).into());
            m.insert("freqcap-events-counted", counted.into());
            return Err(e);
        }
        if counted + duplicates == 0 {
            return Err(status(FrontError::invalid(
                "events",
                "at least one event is needed",
            )));
        }
        Ok(Response::new(pb::EventsCounted {
            counted,
            duplicates,
        }))
    }

    /// `Usage`: a user's caps on a campaign, read without debiting.
    async fn usage(&self, req: Request<pb::UsageRequest>) -> Result<Response<pb::Usage>, Status> {
        let _slot = self.enter(&req).await?;
        let r = req.into_inner();
        self.id("user", &r.user)?;
        self.id("campaign", &r.campaign)?;
        let e = self.state.engine.clone();
        let kind = r.kind.unwrap_or_else(|| "user".into());
        let (u, c, k) = (r.user.clone(), r.campaign.clone(), kind.clone());
        let caps = blocking(move || e.identity_usage(&k, &u, &c))
            .await
            .map_err(status)?;
        Ok(Response::new(convert::usage(
            r.user, r.campaign, kind, caps,
        )))
    }

    /// `Delivery`: a campaign's budget spend and its cap now.
    async fn delivery(
        &self,
        req: Request<pb::DeliveryRequest>,
    ) -> Result<Response<pb::Delivery>, Status> {
        let _slot = self.enter(&req).await?;
        let r = req.into_inner();
        self.id("campaign", &r.campaign)?;
        let e = self.state.engine.clone();
        let name = r.campaign.clone();
        let d = blocking(move || e.delivery(&name)).await.map_err(status)?;
        let pacing = crate::front::call::pacing_of(&self.state.engine, &r.campaign);
        Ok(Response::new(convert::delivery(d, pacing)))
    }

    /// `Forecast`: `POST /v1/forecast`'s, on the same checks.
    async fn forecast(
        &self,
        req: Request<pb::ForecastRequest>,
    ) -> Result<Response<pb::Forecast>, Status> {
        let _slot = self.enter(&req).await?;
        let body = convert::forecast_request(req.into_inner()).map_err(status)?;
        let f = crate::api::forecast::run_forecast(body)
            .await
            .map_err(status)?;
        Ok(Response::new(convert::forecast(f)))
    }
}
