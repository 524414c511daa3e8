//! Test certificates made with rcgen (a CA, and server and client
//! certificates it signs, written as PEM files), and a blocking TLS client
//! on rustls that speaks HTTP/1.1, for the tests of TLS (tls.rs,
//! secured_redis.rs).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
    PKCS_ECDSA_P256_SHA256, PKCS_ED25519, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// Its certificate, PEM.
    pub pem: String,
}

/// A certificate and its key, PEM, and the files they were written to.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Ca {
    /// A new CA named `name`. Its key is Ed25519, whose signatures have
    /// one size: two certificates it signs of one shape have one length.
    pub fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate_for(&PKCS_ED25519).expect("key");
        let issuer = CertifiedIssuer::self_signed(p, key).expect("self-signed CA");
        let pem = issuer.pem();
        Ca { issuer, pem }
    }

    /// Writes the CA's certificate to `dir/<file>`.
    pub fn write(&self, dir: &Path, file: &str) -> PathBuf {
        let path = dir.join(file);
        std::fs::write(&path, &self.pem).expect("CA written");
        path
    }

    /// A certificate for loopback (`localhost`, `127.0.0.1`) named `name`
    /// with serial `serial`, written to `dir/<name>.pem` and
    /// `dir/<name>.key`.
    pub fn leaf(&self, dir: &Path, name: &str, serial: u64) -> Leaf {
        let mut p = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("params");
        p.distinguished_name.push(DnType::CommonName, name);
        // A fixed-width serial, so that certificates differing only in it
        // and their key have the same length.
        p.serial_number = Some(SerialNumber::from_slice(&(serial | 1 << 62).to_be_bytes()));
        // P-256 (PKCS#8): OpenSSL's clients (curl, Redis) read these keys,
        // where ring's Ed25519 PKCS#8 v2 keys were refused by curl.
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
        let cert = p.signed_by(&key, &self.issuer).expect("signed");
        let leaf = Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
        };
        std::fs::write(&leaf.cert, &leaf.cert_pem).expect("cert written");
        std::fs::write(&leaf.key, &leaf.key_pem).expect("key written");
        leaf
    }
}

impl Leaf {
    /// The certificate, DER (what a client sees of the server).
    pub fn der(&self) -> Vec<u8> {
        CertificateDer::from_pem_slice(self.cert_pem.as_bytes())
            .expect("PEM")
            .to_vec()
    }
}

/// A TLS client trusting some CAs, with or without a client certificate.
pub struct TlsClient {
    config: Arc<rustls::ClientConfig>,
}

/// An open TLS connection.
pub type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

impl TlsClient {
    pub fn new(cas: &[&str], client: Option<&Leaf>, alpn: &[&str]) -> TlsClient {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for pem in cas {
            for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                roots.add(c.expect("PEM")).expect("a CA");
            }
        }
        let b = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots);
        let mut config = match client {
            None => b.with_no_client_auth(),
            Some(l) => b
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(l.cert_pem.as_bytes()).expect("PEM")],
                    PrivateKeyDer::from_pem_slice(l.key_pem.as_bytes()).expect("key"),
                )
                .expect("client certificate"),
        };
        config.alpn_protocols = alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
        TlsClient {
            config: Arc::new(config),
        }
    }

    /// Connects and completes the handshake (the server's verdict on a
    /// client certificate comes with its first answer in TLS 1.3: see
    /// [`request`]).
    pub fn connect(&self, addr: &str) -> Result<TlsStream, String> {
        let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
        let conn =
            rustls::ClientConnection::new(self.config.clone(), name).map_err(|e| e.to_string())?;
        let mut s = rustls::StreamOwned::new(conn, tcp);
        while s.conn.is_handshaking() {
            s.conn
                .complete_io(&mut s.sock)
                .map_err(|e| format!("handshake: {e}"))?;
        }
        Ok(s)
    }
}

/// The server's certificate, DER, and the protocol ALPN chose.
pub fn peer(s: &TlsStream) -> (Vec<u8>, Option<String>) {
    let cert = s
        .conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    let alpn = s
        .conn
        .alpn_protocol()
        .map(|a| String::from_utf8_lossy(a).into_owned());
    (cert, alpn)
}

/// One HTTP/1.1 request on a kept-alive connection: the status and body,
/// or what went wrong (a refused client certificate shows here).
pub fn request(
    s: &mut TlsStream,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<(u16, String), String> {
    request_with_head(s, method, path, body).map(|(st, _, body)| (st, body))
}

/// [`request`], with the answer's head (status line and headers) too.
pub fn request_with_head(
    s: &mut TlsStream,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<(u16, String, String), String> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|_| s.write_all(body.as_bytes()))
        .and_then(|_| s.flush())
        .map_err(|e| format!("write: {e}"))?;
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    // The head, byte by byte (bounded: 64 KiB).
    while !got.ends_with(b"\r\n\r\n") {
        if got.len() > 64 * 1024 {
            return Err("a head over 64 KiB".into());
        }
        match s.read(&mut byte) {
            Ok(0) => return Err(format!("closed after {} bytes", got.len())),
            Ok(_) => got.push(byte[0]),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    let head = String::from_utf8_lossy(&got).into_owned();
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).map_err(|e| format!("body: {e}"))?;
    Ok((status, head, String::from_utf8_lossy(&body).into_owned()))
}
