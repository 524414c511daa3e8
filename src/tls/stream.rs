//! A connection's byte stream, plaintext or TLS, and [`accept`], which
//! turns an accepted socket into one.
//!
//! The handshake runs in the connection's own task, under the listener's
//! header deadline, and counts against its connection cap from accept on:
//! a client that opens sockets and never finishes (or never starts) a
//! handshake holds a place for that long at most, as a slow request head
//! does. rustls keeps at most one handshake message (64 KiB, its
//! `MAX_HANDSHAKE_SIZE`) of a connection in memory.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use super::{Proto, Tls};

/// A connection's bytes.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Stream::Plain(s) => s.peer_addr(),
            Stream::Tls(s) => s.get_ref().0.peer_addr(),
        }
    }
}

/// The first byte of a TLS connection: a handshake record (RFC 8446 §5.1).
const TLS_HANDSHAKE: u8 = 0x16;

/// How long a plaintext client on a TLS port has to read why it is closed.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// The accepted socket as a [`Stream`]: as it is without TLS; with TLS,
/// once its handshake completed within `deadline`. `None`: closed (the
/// handshake failed or took too long, or the client spoke plaintext and
/// was told the port speaks TLS), counted in [`super::TlsCounters`].
pub async fn accept(
    tls: Option<&Arc<Tls>>,
    proto: Proto,
    tcp: TcpStream,
    deadline: Duration,
) -> Option<Stream> {
    let Some(tls) = tls else {
        return Some(Stream::Plain(tcp));
    };
    let counters = &tls.counters;
    let handshake = async {
        let mut first = [0u8; 1];
        match tcp.peek(&mut first).await {
            Ok(1) if first[0] == TLS_HANDSHAKE => {}
            // Closed before a byte, or a socket error: nothing to tell.
            Ok(0) | Err(_) => return None,
            Ok(_) => {
                counters.plaintext_refused.inc();
                refuse_plaintext(tcp, proto).await;
                return None;
            }
        }
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config(proto));
        match acceptor.accept(tcp).await {
            Ok(s) => Some(Stream::Tls(Box::new(s))),
            Err(e) => {
                counters.handshake_failures.inc();
                // Debug: scanners and clients without a certificate would
                // fill the log at warn.
                tracing::debug!(error = %e, "TLS handshake failed");
                None
            }
        }
    };
    match tokio::time::timeout(deadline, handshake).await {
        Ok(s) => s,
        Err(_) => {
            counters.handshake_failures.inc();
            None
        }
    }
}

/// Tells a plaintext client, in its own protocol where it has a way to
/// read one, that the port speaks TLS; then closes, having read (and
/// dropped) what it sent for [`REFUSAL_LINGER`] at most, so that closing
/// with its request unread does not reset the connection before it reads
/// the answer.
async fn refuse_plaintext(mut tcp: TcpStream, proto: Proto) {
    let mut head = [0u8; 2];
    let n = tcp.peek(&mut head).await.unwrap_or(0);
    let h2c = head[..n] == *b"PR";
    let answer = match proto {
        // An h2c client cannot read HTTP/1 text: closed.
        Proto::Http | Proto::Grpc if h2c => String::new(),
        Proto::Http => {
            const BODY: &str = "This port speaks TLS: use https:// instead.\n";
            format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{BODY}",
                BODY.len()
            )
        }
        Proto::Grpc => String::new(),
        Proto::Resp => "-ERR this port speaks TLS (redis-cli --tls)\r\n".into(),
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        if !answer.is_empty() {
            tcp.write_all(answer.as_bytes()).await?;
        }
        tcp.shutdown().await?;
        let mut sink = [0u8; 4096];
        // At most 64 KiB read before closing.
        for _ in 0..16 {
            if tcp.read(&mut sink).await? == 0 {
                break;
            }
        }
        io::Result::Ok(())
    })
    .await;
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}
