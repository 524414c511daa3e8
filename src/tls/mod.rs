//! TLS on every listener (docs/service.md, "TLS"): the server's
//! certificate and key, and optionally the CA whose client certificates
//! are required (mutual TLS), loaded from PEM files into one rustls
//! configuration per protocol (ALPN differs), and reloaded when the files
//! change or on SIGHUP without touching the connections already open.
//!
//! rustls runs on ring, its only provider in this build: nothing is
//! compiled from C++ or with cmake, and no OpenSSL is linked.
//!
//! [`stream`] accepts a connection: the handshake under a deadline, and a
//! plaintext client on a TLS port told so and closed.

pub mod stream;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use prometheus_client::metrics::counter::Counter;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, ServerConfig, SignatureScheme};

pub use stream::{Stream, accept};

/// The files TLS is configured with (options `tls_cert`, `tls_key`,
/// `tls_client_ca`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM: the server's certificate, then its chain.
    pub cert: PathBuf,
    /// PEM: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM: the CAs a client certificate must chain to; set, every
    /// connection must present one (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// What a listener speaks, for ALPN and for the answer a plaintext client
/// gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// The HTTP API: `h2` or `http/1.1`.
    Http,
    /// gRPC (and Envoy's rate limit service): `h2` only.
    Grpc,
    /// The Redis protocol: no ALPN.
    Resp,
}

impl Proto {
    fn alpn(self) -> Vec<Vec<u8>> {
        match self {
            Proto::Http => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            Proto::Grpc => vec![b"h2".to_vec()],
            Proto::Resp => Vec::new(),
        }
    }
}

/// Figures of TLS (registered in `/metrics` by `src/front/metrics.rs`).
#[derive(Debug, Clone, Default)]
pub struct TlsCounters {
    /// Certificates loaded again (file change or SIGHUP).
    pub reloads: Counter,
    /// Reloads refused (the files in force stay).
    pub reload_failures: Counter,
    /// Handshakes that failed: a bad or missing client certificate, a
    /// protocol error, or the deadline passed.
    pub handshake_failures: Counter,
    /// Connections that sent plaintext to a TLS port (told so, closed).
    pub plaintext_refused: Counter,
}

/// The certificates in force, one configuration per protocol.
struct Loaded {
    /// The certificate and key, also presented as a client certificate
    /// when forwarding to another node under mutual TLS.
    key: Arc<CertifiedKey>,
    http: Arc<ServerConfig>,
    grpc: Arc<ServerConfig>,
    resp: Arc<ServerConfig>,
}

/// Modification time and size of each file (`None`: unreadable).
type Stamps = Vec<Option<(SystemTime, u64)>>;

/// TLS settings shared by every listener.
pub struct Tls {
    files: TlsFiles,
    current: RwLock<Loaded>,
    /// The files' stamps at the last load tried, successful or not: a
    /// file that failed to load is tried again once it changes, not at
    /// every look.
    seen: std::sync::Mutex<Stamps>,
    pub counters: TlsCounters,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish()
    }
}

/// How often the files are looked at for a change (their modification
/// time and size): a renewed certificate is in force within this.
pub const WATCH_EVERY: Duration = Duration::from_secs(2);

impl Tls {
    /// Loads the files; errors name the option (`tls_cert: ...`).
    /// `counters` are the ones `/metrics` exports.
    pub fn load(files: TlsFiles, counters: TlsCounters) -> Result<Tls, String> {
        let seen = stamps(&files);
        let loaded = load(&files)?;
        Ok(Tls {
            files,
            current: RwLock::new(loaded),
            seen: std::sync::Mutex::new(seen),
            counters,
        })
    }

    /// The configuration a new connection of `proto` is accepted with.
    pub fn config(&self, proto: Proto) -> Arc<ServerConfig> {
        let l = self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match proto {
            Proto::Http => l.http.clone(),
            Proto::Grpc => l.grpc.clone(),
            Proto::Resp => l.resp.clone(),
        }
    }

    /// Whether client certificates are required.
    pub fn mutual(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// The files it was configured with.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Loads the files again; on an error the certificates in force stay.
    /// Connections already open keep the session they have.
    pub fn reload(&self) -> Result<(), String> {
        // Stamped before reading: a file replaced while it is read is read
        // again at the next look.
        *self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = stamps(&self.files);
        match load(&self.files) {
            Ok(loaded) => {
                *self
                    .current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = loaded;
                self.counters.reloads.inc();
                Ok(())
            }
            Err(e) => {
                self.counters.reload_failures.inc();
                Err(e)
            }
        }
    }

    /// Whether a file changed since it was last loaded (or tried).
    fn changed(&self) -> bool {
        let now = stamps(&self.files);
        *self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            != now
    }

    /// Reloads on SIGHUP and when a file changes, logging each outcome,
    /// until the process ends. SIGHUP is listened for from this call on
    /// (see `RulesHandle::reload_on_sighup` for why not from the first poll).
    pub fn reload_when_changed(self: Arc<Self>) -> impl std::future::Future<Output = ()> + Send {
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        async move {
            let mut tick = tokio::time::interval(WATCH_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let signalled = async {
                    match hup.as_mut() {
                        Some(h) => h.recv().await.is_some(),
                        None => std::future::pending().await,
                    }
                };
                let why = tokio::select! {
                    true = signalled => "SIGHUP",
                    _ = tick.tick() => {
                        if !self.changed() {
                            continue;
                        }
                        "a file changed"
                    }
                };
                let me = self.clone();
                match tokio::task::spawn_blocking(move || me.reload()).await {
                    Ok(Ok(())) => tracing::info!(
                        cert = %self.files.cert.display(),
                        "TLS certificates reloaded ({why}); new connections use them"
                    ),
                    Ok(Err(e)) => tracing::error!(
                        "TLS certificates not reloaded ({why}), the ones in force stay: {e}"
                    ),
                    Err(e) => tracing::error!("TLS reload failed: {e}"),
                }
            }
        }
    }
}

/// Presents the node's certificate in force as a client certificate.
#[derive(Debug)]
struct CurrentKey(Arc<Tls>);

impl ResolvesClientCert for CurrentKey {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        let l = self
            .0
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Some(l.key.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The client side of owner mode's forwarding between nodes over TLS:
/// trusts `peer_ca` (the CA the other nodes' certificates chain to) and,
/// under mutual TLS, presents this node's certificate in force (reloads
/// included). Errors name `tls_peer_ca`.
pub fn peer_client(tls: &Arc<Tls>, peer_ca: &Path) -> Result<Arc<ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates("tls_peer_ca", peer_ca)? {
        roots
            .add(c)
            .map_err(|e| format!("tls_peer_ca: {}: {e}", peer_ca.display()))?;
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls_peer_ca: {e}"))?
        .with_root_certificates(roots);
    let config = if tls.mutual() {
        builder.with_client_cert_resolver(Arc::new(CurrentKey(tls.clone())))
    } else {
        builder.with_no_client_auth()
    };
    Ok(Arc::new(config))
}

fn stamps(files: &TlsFiles) -> Stamps {
    [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|p| {
        std::fs::metadata(p)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())))
    })
    .collect()
}

/// Largest PEM file read (a chain of a few certificates is a few KB).
const MAX_PEM: u64 = 1 << 20;

fn read_pem(option: &str, path: &Path) -> Result<Vec<u8>, String> {
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("{option}: cannot read {}: {e}", path.display()))?;
    if meta.len() > MAX_PEM {
        return Err(format!(
            "{option}: {} is {} bytes; a PEM file is at most {MAX_PEM}",
            path.display(),
            meta.len()
        ));
    }
    std::fs::read(path).map_err(|e| format!("{option}: cannot read {}: {e}", path.display()))
}

fn certificates(option: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_pem(option, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{option}: {} is not PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{option}: no certificate (BEGIN CERTIFICATE) in {}",
            path.display()
        ));
    }
    Ok(certs)
}

/// The ring provider, the only one this build has.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes ring the process's default provider, for the clients that ask for
/// the default (the Redis client's `rediss://`). Idempotent.
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn load(files: &TlsFiles) -> Result<Loaded, String> {
    let certs = certificates("tls_cert", &files.cert)?;
    let key_pem = read_pem("tls_key", &files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| format!("tls_key: no private key in {} ({e})", files.key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls_cert: {e}"))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certificates("tls_client_ca", ca)? {
                roots
                    .add(c)
                    .map_err(|e| format!("tls_client_ca: {}: {e}", ca.display()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.into(),
                provider(),
            )
            .build()
            .map_err(|e| format!("tls_client_ca: {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let signing = provider()
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| format!("tls_key: {}: {e}", files.key.display()))?;
    let certified = Arc::new(CertifiedKey::new(certs.clone(), signing));
    let base = builder.with_single_cert(certs, key).map_err(|e| {
        format!(
            "tls_key: {} does not go with tls_cert {}: {e}",
            files.key.display(),
            files.cert.display()
        )
    })?;
    let with = |proto: Proto| {
        let mut c = base.clone();
        c.alpn_protocols = proto.alpn();
        Arc::new(c)
    };
    Ok(Loaded {
        key: certified,
        http: with(Proto::Http),
        grpc: with(Proto::Grpc),
        resp: with(Proto::Resp),
    })
}
