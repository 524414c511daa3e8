//! How to reach Redis (docs/cluster.md, "Connecting", "A secured Redis"):
//! the `store` URL's scheme (one Redis or a cluster, plaintext or TLS), its
//! seeds and credentials, and the files TLS to Redis is configured with.
//! A password is held as a [`Secret`], whose `Debug` never shows it, and
//! [`RedisOptions::redact`] is what logs print of a URL.

use std::path::Path;
use std::time::Duration;

use percent_encoding::percent_decode_str;

use crate::store::Durability;

/// A password: its `Debug` never shows it, so neither a log line nor an
/// error printing a configuration can.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The store URLs' schemes: (scheme, one Redis, TLS).
const SCHEMES: [(&str, bool, bool); 4] = [
    ("redis-cluster://", false, false),
    ("rediss-cluster://", false, true),
    ("redis://", true, false),
    ("rediss://", true, true),
];

/// How to reach and use Redis.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Seed nodes, `host:port`.
    pub seeds: Vec<String>,
    /// `redis://` or `rediss://`: one Redis (its primary), not a cluster.
    pub single: bool,
    /// `rediss://` or `rediss-cluster://`: TLS to every node.
    pub tls: bool,
    /// The ACL user (`USER:PASSWORD@`); `None`: `default`.
    pub username: Option<String>,
    /// The password (`AUTH`), from the URL, a file or the environment.
    pub password: Option<Secret>,
    /// The CA Redis's certificates chain to, and this node's client
    /// certificate (PEM; their `Debug` is redacted by the client crate).
    pub certs: Option<redis::TlsCertificates>,
    /// `Wal`: acknowledged once the primary applied a write; `Replicated`
    /// and `Fsync`: also once a replica has it (`WAIT 1`).
    pub durability: Durability,
    /// Deadline of one call (a write and its `WAIT` together).
    pub call_timeout: Duration,
}

impl RedisOptions {
    /// Whether `store` names Redis (any of the four schemes).
    pub fn is_url(store: &str) -> bool {
        SCHEMES.iter().any(|(s, ..)| store.starts_with(s))
    }

    /// Parses `SCHEME://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]`, where
    /// SCHEME is `redis`, `rediss` (one Redis), `redis-cluster` or
    /// `rediss-cluster`; the user and password are percent-decoded.
    pub fn parse(url: &str, durability: Durability) -> Result<Self, String> {
        let Some((scheme, single, tls)) = SCHEMES.iter().find(|(s, ..)| url.starts_with(s)) else {
            return Err(format!(
                "store: expected rocksdb, memory, redis://, rediss://, redis-cluster:// or rediss-cluster://, got {:?}",
                Self::redact(url)
            ));
        };
        let rest = &url[scheme.len()..];
        // The credentials end at the last '@' (a password may hold one
        // percent-encoded, or not).
        let (userinfo, hosts) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => {
                // `USER:PASSWORD`, `:PASSWORD` (the default user), or
                // `USER` (its password from a file or the environment).
                let (user, pass) = u.split_once(':').unwrap_or((u, ""));
                let decode = |part: &str, what: &str| {
                    percent_decode_str(part)
                        .decode_utf8()
                        .map(|s| s.into_owned())
                        .map_err(|_| format!("store: the URL's {what} is not UTF-8 once decoded"))
                };
                let user = decode(user, "user")?;
                let pass = decode(pass, "password")?;
                if user.is_empty() && pass.is_empty() {
                    return Err("store: the URL has '@' but no user or password before it".into());
                }
                (
                    (!user.is_empty()).then_some(user),
                    (!pass.is_empty()).then_some(Secret(pass)),
                )
            }
        };
        let seeds: Vec<String> = hosts
            .split(',')
            .map(|s| s.trim().trim_end_matches('/').to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        if seeds.is_empty() {
            return Err(format!("store: {scheme} needs at least one HOST:PORT"));
        }
        if *single && seeds.len() > 1 {
            return Err(format!(
                "store: {scheme} is one Redis; several nodes are a cluster ({}://)",
                if *tls {
                    "rediss-cluster"
                } else {
                    "redis-cluster"
                }
            ));
        }
        for s in &seeds {
            let ok = s
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                return Err(format!("store: {s:?} is not HOST:PORT"));
            }
        }
        if durability == Durability::Async {
            return Err(
                "durability: async is not a mode of a Redis store (wal, replicated or fsync)"
                    .into(),
            );
        }
        Ok(RedisOptions {
            seeds,
            single: *single,
            tls: *tls,
            username,
            password,
            certs: None,
            durability,
            call_timeout: Duration::from_millis(100),
        })
    }

    /// Adds what the URL does not say: a password from a file or the
    /// environment (refused when the URL has one too), the CA and client
    /// certificate of TLS to Redis. Errors name the option.
    pub fn secure(
        mut self,
        password: Option<Secret>,
        ca: Option<&Path>,
        client: Option<(&Path, &Path)>,
    ) -> Result<Self, String> {
        if let Some(p) = password {
            if self.password.is_some() {
                return Err(
                    "store: the URL has a password, and store_password_file or FREQCAP_STORE_PASSWORD gives one too; give one"
                        .into(),
                );
            }
            self.password = Some(p);
        }
        if (ca.is_some() || client.is_some()) && !self.tls {
            let option = if ca.is_some() {
                "store_ca"
            } else {
                "store_cert"
            };
            return Err(format!(
                "{option}: TLS to Redis needs a rediss:// or rediss-cluster:// store"
            ));
        }
        if !self.tls {
            return Ok(self);
        }
        let read = |option: &str, p: &Path| {
            std::fs::read(p).map_err(|e| format!("{option}: cannot read {}: {e}", p.display()))
        };
        let root_cert = ca.map(|p| read("store_ca", p)).transpose()?;
        let client_tls = match client {
            None => None,
            Some((cert, key)) => Some(redis::ClientTlsConfig {
                client_cert: read("store_cert", cert)?,
                client_key: read("store_key", key)?,
            }),
        };
        self.certs = Some(redis::TlsCertificates {
            client_tls,
            root_cert,
        });
        Ok(self)
    }

    /// `url` with its password replaced by `***`: what logs and answers
    /// show of a store.
    pub fn redact(url: &str) -> String {
        let Some(at) = url.rfind('@') else {
            return url.to_owned();
        };
        let start = url.find("://").map_or(0, |i| i + 3);
        if start > at {
            return url.to_owned();
        }
        match url[start..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..start], &url[at..]),
            // A user alone: no password to hide.
            None => url.to_owned(),
        }
    }

    /// The URL of `seed` as the client crate takes it: `redis://` or
    /// `rediss://`, no credentials (they are set apart).
    pub(super) fn seed_url(&self, seed: &str) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://{seed}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_are_parsed_or_refused_naming_the_option() {
        let o = RedisOptions::parse(
            "redis-cluster://127.0.0.1:7100,127.0.0.1:7101",
            Durability::Wal,
        )
        .unwrap();
        assert_eq!(o.seeds, ["127.0.0.1:7100", "127.0.0.1:7101"]);
        assert!(!o.single && !o.tls && o.password.is_none());
        for bad in [
            "redis-clusters://x:1",
            "http://x:1",
            "redis-cluster://",
            "redis-cluster://host",
            "redis-cluster://h:0",
            "redis://a:1,b:2",
            "rediss://@h:1",
        ] {
            let e = RedisOptions::parse(bad, Durability::Wal).unwrap_err();
            assert!(e.starts_with("store"), "{bad}: {e}");
        }
        let e = RedisOptions::parse("redis-cluster://h:1", Durability::Async).unwrap_err();
        assert!(e.starts_with("durability"), "{e}");
    }

    #[test]
    fn credentials_are_taken_apart_decoded_and_never_shown() {
        let url = "rediss-cluster://freqcap:p%40ss%3Aw0rd@10.0.0.1:6379,10.0.0.2:6379";
        let o = RedisOptions::parse(url, Durability::Replicated).unwrap();
        assert!(o.tls && !o.single);
        assert_eq!(o.username.as_deref(), Some("freqcap"));
        assert_eq!(o.password, Some(Secret("p@ss:w0rd".into())));
        assert_eq!(o.seeds, ["10.0.0.1:6379", "10.0.0.2:6379"]);
        let shown = format!("{o:?} {}", RedisOptions::redact(url));
        assert!(!shown.contains("w0rd"), "{shown}");
        assert_eq!(
            RedisOptions::redact(url),
            "rediss-cluster://freqcap:***@10.0.0.1:6379,10.0.0.2:6379"
        );
        // Password only, as redis-cli's -a; a user only, its password
        // given apart.
        let o = RedisOptions::parse("rediss://:s3cret@h:1", Durability::Wal).unwrap();
        assert!(o.single && o.username.is_none());
        assert_eq!(o.password, Some(Secret("s3cret".into())));
        let o = RedisOptions::parse("rediss://freqcap@h:1", Durability::Wal).unwrap();
        assert_eq!(o.username.as_deref(), Some("freqcap"));
        assert!(o.password.is_none());
        assert_eq!(
            RedisOptions::redact("rediss://freqcap@h:1"),
            "rediss://freqcap@h:1"
        );
        assert_eq!(RedisOptions::redact("redis://h:1"), "redis://h:1");
        // A password from elsewhere, but not from two places.
        let o = RedisOptions::parse("redis://h:1", Durability::Wal)
            .unwrap()
            .secure(Some(Secret("x".into())), None, None)
            .unwrap();
        assert_eq!(o.password, Some(Secret("x".into())));
        let e = RedisOptions::parse("redis://:a@h:1", Durability::Wal)
            .unwrap()
            .secure(Some(Secret("b".into())), None, None)
            .unwrap_err();
        assert!(e.starts_with("store:"), "{e}");
        // A CA for a plaintext store is a mistake, said so.
        let e = RedisOptions::parse("redis://h:1", Durability::Wal)
            .unwrap()
            .secure(None, Some(Path::new("/nonexistent")), None)
            .unwrap_err();
        assert!(e.starts_with("store_ca:"), "{e}");
    }
}
