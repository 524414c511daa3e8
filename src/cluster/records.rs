//! User and policy-key records: read, peeked at and written by
//! compare-and-set (`fc_cas_v1`), event ids claimed; in owner mode, claimed
//! and written fenced by the owner's epoch (`fc_own_v1`, `fc_cas_v2`), and
//! the members (`fc_member_v1`).

use std::sync::atomic::Ordering;

use redis::Value;

use super::conn::{RedisStore, bytes, int, ms, redis_key, unexpected};
use super::{HEAT_KEY, MEMBERS_KEY};
use crate::clock::Nanos;
use crate::store::{
    Cas, HeatReport, HeatTables, Hot, Membership, Owned, OwnedRecords, Records, StoreError,
};

impl Records for RedisStore {
    /// Redis's clock minus this node's, as `time.rs` measures it: every
    /// node decides at Redis's time, so one node's wrong clock moves no cap
    /// (docs/cluster.md, "Cluster time").
    fn clock_offset(&self) -> Option<i64> {
        Some(self.clock.offset())
    }

    /// One `HMGET v b`: a plain read, no function, since a read promises
    /// nothing beyond "this was the record at some instant"; the write
    /// that follows is what checks the version.
    fn read(&self, key: &[u8]) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        let mut c = redis::cmd("HMGET");
        c.arg(redis_key(key)).arg("v").arg("b");
        let v = self.query("HMGET record", c)?;
        match &v {
            Value::Array(a) if a.len() == 2 => match (&a[0], &a[1]) {
                // An owner's claim of a user with no record yet (owner
                // mode, `fc_own_v1`): a version, no value.
                (Value::Nil, _) | (_, Value::Nil) => Ok(None),
                (ver, b) => match (int(ver), bytes(b)) {
                    (Some(ver), Some(b)) => Ok(Some((ver, b))),
                    _ => Err(unexpected("HMGET record", &v)),
                },
            },
            _ => Err(unexpected("HMGET record", &v)),
        }
    }

    /// `fc_peek_v1`: whether our copy is still current, with the record only
    /// if it moved. A denial writes nothing, so without this it would rest
    /// on a copy another node may have changed; a full read for it cost a
    /// record's bytes (~900 for a warm user, BENCHMARKS.md) per denial.
    fn peek(&self, key: &[u8], version: u64) -> Result<Option<Option<(u64, Vec<u8>)>>, StoreError> {
        let mut c = redis::cmd("FCALL");
        c.arg("fc_peek_v1").arg(1).arg(redis_key(key)).arg(version);
        let v = self.query("fc_peek_v1", c)?;
        match &v {
            Value::Int(1) => Ok(None),
            Value::Array(a) => match a.as_slice() {
                [ver, b] if int(ver) == Some(0) || matches!(b, Value::Nil) => Ok(Some(None)),
                [ver, b] => match (int(ver), bytes(b)) {
                    (Some(ver), Some(b)) => Ok(Some(Some((ver, b)))),
                    _ => Err(unexpected("fc_peek_v1", &v)),
                },
                _ => Err(unexpected("fc_peek_v1", &v)),
            },
            _ => Err(unexpected("fc_peek_v1", &v)),
        }
    }

    /// `fc_cas_v3` (`fc_cas_v1`, refused while a hot key's record is
    /// frozen): written only if the record is still at `expected`, else
    /// the current record comes back in the same reply, so the engine
    /// decides again without another read (at most 3 times, then 503:
    /// docs/cluster.md). With affinity that is 1.79 compare-and-sets per ad
    /// and 0 % conflicts; spread over three nodes 9.6 % (BENCHMARKS.md).
    fn cas(
        &self,
        key: &[u8],
        expected: u64,
        value: &[u8],
        expire_at: Nanos,
    ) -> Result<Cas, StoreError> {
        let mut c = redis::cmd("FCALL");
        c.arg("fc_cas_v3")
            .arg(1)
            .arg(redis_key(key))
            .arg(expected)
            .arg(value)
            .arg(ms(expire_at));
        self.cas_call("fc_cas_v3", &c)
    }

    /// `fc_hot_v1`: freezes a hot key's record (or extends a freeze), so
    /// its decisions go to leases seeded from one copy.
    fn hot(&self, key: &[u8], until: Nanos, freeze: bool) -> Result<Hot, StoreError> {
        let mut c = redis::cmd("FCALL");
        c.arg("fc_hot_v1")
            .arg(1)
            .arg(redis_key(key))
            .arg(ms(until))
            .arg(u8::from(freeze));
        let (v, replicas) = self.fcall(&c, self.waits())?;
        if replicas < 1 {
            self.stats.unreplicated.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable(
                "the freeze was not confirmed by a replica in time (durability replicated)".into(),
            ));
        }
        let bad = || unexpected("fc_hot_v1", &v);
        let Value::Array(a) = &v else {
            return Err(bad());
        };
        match a.as_slice() {
            [zero, ver] if int(zero) == Some(0) => Ok(Hot::Cold {
                version: int(ver).ok_or_else(bad)?,
            }),
            [since, exp, b] => Ok(Hot::Frozen {
                since_ms: int(since).ok_or_else(bad)?,
                expire_at_ms: int(exp).ok_or_else(bad)?,
                value: bytes(b),
            }),
            _ => Err(bad()),
        }
    }

    /// `SET NX PXAT` of an event id: the first node to set it counts the
    /// event, any later one answers it as a duplicate. A plain command, not
    /// a function: one key, one atomic step.
    fn claim(&self, key: &[u8], expire_at: Nanos, token: &[u8]) -> Result<bool, StoreError> {
        let mut c = redis::cmd("SET");
        c.arg(redis_key(key))
            .arg(token)
            .arg("NX")
            .arg("PXAT")
            .arg(ms(expire_at).max(1));
        let conn = self.conn.clone();
        let wait_ms = (self.options.call_timeout.as_millis() as u64 / 2).max(1);
        let waits = self.waits();
        let (v, replicas) = self.run("SET NX event id", async move {
            if waits {
                conn.query_and_wait(&c, wait_ms).await
            } else {
                Ok((conn.query(&c).await?, 1))
            }
        })?;
        if replicas < 1 {
            self.stats.unreplicated.fetch_add(1, Ordering::Relaxed);
            // The event is answered 503 and not counted: give the claim
            // back (if this call set it), so that the client's retry claims
            // it afresh and counts it. Kept, it made the retry a duplicate
            // and the event was never counted (seen under load in
            // `events_are_counted_once_cluster_wide`). Best effort: should
            // this fail too, the event is lost, not counted twice.
            if !matches!(v, Value::Nil) {
                let _ = self.unclaim(key);
            }
            return Err(StoreError::Unavailable(
                "the event id was not confirmed by a replica in time".into(),
            ));
        }
        // Taken: a duplicate, whoever took it. (Matching the token here, as
        // this once did, made every repeat of a user-less event with the
        // same content "its own claim": posted to n1, n2, n3, n1 it was
        // counted 4 times.) Also one call fewer per duplicate (no GET).
        Ok(!matches!(v, Value::Nil))
    }

    /// Gives an event id back when its count was not acknowledged (see
    /// `claim`), so the client's retry counts it.
    fn unclaim(&self, key: &[u8]) -> Result<(), StoreError> {
        let mut c = redis::cmd("DEL");
        c.arg(redis_key(key));
        self.query("DEL event id", c).map(drop)
    }
}

impl OwnedRecords for RedisStore {
    /// `fc_own_v1`: a new owner's claim of a record, which moves its version
    /// so no write made on an older copy lands. One claim per user a node
    /// first meets: 0.25 of owner mode's 1.09 round trips per ad warm, and
    /// why 1 M cold users cost 1.50 (BENCHMARKS.md).
    fn own(&self, key: &[u8], epoch: u64, absent_ttl: Nanos) -> Result<Owned, StoreError> {
        let mut c = redis::cmd("FCALL");
        c.arg("fc_own_v1")
            .arg(1)
            .arg(redis_key(key))
            .arg(epoch)
            .arg(absent_ttl / 1_000_000);
        // A claim is a write: it waits for a replica as commits do, or a
        // failover could forget it and let a deposed owner write again.
        let (v, replicas) = self.fcall(&c, self.waits())?;
        let Value::Array(a) = &v else {
            return Err(unexpected("fc_own_v1", &v));
        };
        match a.as_slice() {
            [Value::Int(-1), e] => Ok(Owned::Fenced(
                int(e).ok_or_else(|| unexpected("fc_own_v1", &v))?,
            )),
            [ok, ver, b] if int(ok) == Some(1) => {
                if replicas < 1 {
                    self.stats.unreplicated.fetch_add(1, Ordering::Relaxed);
                    return Err(StoreError::Unavailable(
                        "the claim was not confirmed by a replica in time (durability replicated)"
                            .into(),
                    ));
                }
                Ok(Owned::Claimed {
                    version: int(ver).ok_or_else(|| unexpected("fc_own_v1", &v))?,
                    value: bytes(b),
                })
            }
            _ => Err(unexpected("fc_own_v1", &v)),
        }
    }

    /// `fc_cas_v2`: `fc_cas_v1` fenced by the owner's epoch, so a deposed
    /// owner that paused past its lease writes nothing (docs/cluster.md,
    /// "Fencing").
    fn cas_owned(
        &self,
        key: &[u8],
        expected: u64,
        value: &[u8],
        expire_at: Nanos,
        epoch: u64,
    ) -> Result<Cas, StoreError> {
        let mut c = redis::cmd("FCALL");
        c.arg("fc_cas_v2")
            .arg(1)
            .arg(redis_key(key))
            .arg(expected)
            .arg(value)
            .arg(ms(expire_at))
            .arg(epoch);
        self.cas_call("fc_cas_v2", &c)
    }

    /// `fc_member_v1`: join (epoch 0) or renew this node's membership lease
    /// and read every member, in one call on one hash. Not waited on a
    /// replica: a membership lost in a failover is renewed within a quarter
    /// of its lease, and a joiner owns nothing before every member has read
    /// it (functions.lua).
    fn member(
        &self,
        node: &str,
        addr: &str,
        epoch: u64,
        ttl_ms: u64,
    ) -> Result<Membership, StoreError> {
        let mut c = redis::cmd("FCALL");
        c.arg("fc_member_v1")
            .arg(1)
            .arg(MEMBERS_KEY)
            .arg(node)
            .arg(addr)
            .arg(epoch)
            .arg(ttl_ms);
        let (v, _) = self.fcall(&c, false)?;
        let bad = || unexpected("fc_member_v1", &v);
        let Value::Array(a) = &v else {
            return Err(bad());
        };
        match a.as_slice() {
            [ok, now] if int(ok) == Some(0) => Ok(Membership::Gone {
                now_ms: int(now).ok_or_else(bad)?,
            }),
            [ok, e, now, Value::Array(list)] if int(ok) == Some(1) => {
                let text = |x: &Value| bytes(x).and_then(|b| String::from_utf8(b).ok());
                let members = list
                    .chunks(2)
                    .map(|p| match p {
                        [n, m] => Some((text(n)?, text(m)?)),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(bad)?;
                Ok(Membership::Lease {
                    epoch: int(e).ok_or_else(bad)?,
                    now_ms: int(now).ok_or_else(bad)?,
                    members,
                })
            }
            _ => Err(bad()),
        }
    }

    /// `fc_heat_v1`: this node's report of its decisions as owner, and the
    /// fleet's tables of heavy users. Not waited on a replica: a table lost
    /// in a failover is made again from the next reports.
    fn heat(&self, r: &HeatReport<'_>) -> Result<HeatTables, StoreError> {
        let mut c = redis::cmd("FCALL");
        c.arg("fc_heat_v1")
            .arg(1)
            .arg(HEAT_KEY)
            .arg(r.node)
            .arg(r.total)
            .arg(r.top)
            .arg(r.every_ms)
            .arg(r.ahead_ms);
        for (h, w) in r.heavy {
            c.arg(format!("{h:032x}")).arg(*w);
        }
        let (v, _) = self.fcall(&c, false)?;
        let bad = || unexpected("fc_heat_v1", &v);
        let Value::Array(a) = &v else {
            return Err(bad());
        };
        let text = |x: &Value| match x {
            Value::Nil => Ok(None),
            x => bytes(x)
                .and_then(|b| String::from_utf8(b).ok())
                .map(Some)
                .ok_or_else(bad),
        };
        match a.as_slice() {
            [now, prev, next] => Ok(HeatTables {
                now_ms: int(now).ok_or_else(bad)?,
                prev: text(prev)?,
                next: text(next)?,
            }),
            _ => Err(bad()),
        }
    }
}
