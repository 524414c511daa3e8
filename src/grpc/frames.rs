//! A gRPC request body handed to tonic one whole message at a time, its
//! bytes charged to the body memory budget while they gather
//! (`src/front/body_budget.rs`).
//!
//! Why: tonic reserves a buffer for a message's *declared* length as soon as
//! it reads the 5-byte prefix (tonic 0.14, codec/decode.rs). 256 streams
//! that each declared 1 MiB and sent 1 byte took the server from 35 to
//! 337 MB from one 6 KB connection, and the bound was `grpc_max_connections
//! × 256 × max_body` (security probe, case 1.20). Here a prefix is held back
//! until its message has arrived, so tonic reserves only what is already
//! in memory and charged; the charge is given back as each message is
//! handed on (a RecordEvents stream holds one message's bytes at a time).

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::{Buf, Bytes, BytesMut};
use http_body::{Frame, SizeHint};

use crate::front::body_budget::{BodyBudget, Charge};

/// gRPC's message prefix: a compression flag and a 4-byte length.
const PREFIX: usize = 5;

/// The body tonic reads (see the module's comment).
pub struct Whole {
    inner: Body,
    buf: BytesMut,
    charge: Charge,
    /// Larger messages are not gathered: their prefix goes on at once and
    /// tonic refuses them (OUT_OF_RANGE), as before.
    max_message: usize,
    /// After a message tonic refuses, bytes pass as they come.
    passthrough: bool,
    /// The inner body's trailers, given after the last message.
    trailers: Option<Frame<Bytes>>,
    ended: bool,
}

impl Whole {
    pub fn new(inner: Body, budget: &BodyBudget, max_message: usize) -> Self {
        Whole {
            inner,
            buf: BytesMut::new(),
            charge: budget.charge(),
            max_message,
            passthrough: false,
            trailers: None,
            ended: false,
        }
    }

    /// The next frame to give tonic from what is buffered, if any is ready.
    fn ready(&mut self) -> Option<Bytes> {
        if self.buf.is_empty() {
            return None;
        }
        if self.passthrough {
            let all = self.buf.split().freeze();
            self.charge.release(all.len());
            return Some(all);
        }
        if self.buf.len() < PREFIX {
            return self.ended.then(|| self.take(self.buf.len()));
        }
        let declared = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        let declared = usize::try_from(declared).unwrap_or(usize::MAX);
        if declared > self.max_message {
            self.passthrough = true;
            let all = self.buf.split().freeze();
            self.charge.release(all.len());
            return Some(all);
        }
        let whole = PREFIX + declared;
        if self.buf.len() >= whole {
            return Some(self.take(whole));
        }
        // A message cut short by the end of the body: tonic says so.
        self.ended.then(|| self.take(self.buf.len()))
    }

    /// The first `n` buffered bytes, their share of the body budget given
    /// back: the budget counts what waits here, not what tonic holds.
    fn take(&mut self, n: usize) -> Bytes {
        let out = self.buf.split_to(n).freeze();
        self.charge.release(out.len());
        out
    }
}

impl http_body::Body for Whole {
    type Data = Bytes;
    type Error = axum::BoxError;

    /// Whole messages only: bytes are buffered (and charged to the budget,
    /// refused RESOURCE_EXHAUSTED past it) until a message's declared length
    /// has arrived, so a client cannot make the server hold a message
    /// larger than `max_message` or more than the budget in sum.
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(message) = this.ready() {
                return Poll::Ready(Some(Ok(Frame::data(message))));
            }
            if this.ended {
                return Poll::Ready(this.trailers.take().map(Ok));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => this.ended = true,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(mut data) => {
                        if let Err(e) = this.charge.add(data.remaining()) {
                            // tonic finds the status in the error's chain.
                            return Poll::Ready(Some(Err(Box::new(crate::front::error::status(
                                e,
                            )))));
                        }
                        this.buf
                            .extend_from_slice(&data.copy_to_bytes(data.remaining()));
                    }
                    Err(frame) => {
                        // Trailers end a request body.
                        this.trailers = Some(frame);
                        this.ended = true;
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.buf.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
