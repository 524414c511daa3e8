//! Lease calls (`fc_lease_v2`, `fc_line_v1`, `fc_plan_v1`, `fc_slots_v2`,
//! `fc_slots_cap_v1`),
//! the fleet's spend of a lease, and the nodes' mailboxes.

use std::sync::atomic::Ordering;

use redis::Value;

use super::conn::{RedisStore, bytes, int, redis_key, unexpected};
use super::mailbox_key;
use crate::store::{
    LeaseCalls, LeaseCap, LeaseGrant, LeaseRequest, LineGrant, LineHeld, LineRequest, PlanRequest,
    SlotsGrant, SlotsHeld, SlotsRequest, StoreError,
};

impl LeaseCalls for RedisStore {
    /// `fc_lease_v2`: this node's max-min fair share of a budget or window,
    /// computed at Redis's time with Σ spent + Σ headroom ≤ the total, so
    /// the fleet never grants more than one node would allow; counts are
    /// absolute, so a retried call or a lost reply grants nothing twice.
    /// 0.66–0.96 calls per ad with 50 leased campaigns and spend reported
    /// at every commit, 0.016 (one node) to 0.135 (three) with `"batched"`
    /// reports (BENCHMARKS.md).
    fn lease(&self, req: &LeaseRequest<'_>) -> Result<LeaseGrant, StoreError> {
        // v2: the period and the total at Redis's time (fc_lease_v1 stays
        // registered for nodes of older releases).
        let (rule, amount, allowance, look_ms) = req.rule.args();
        let mut c = redis::cmd("FCALL");
        c.arg("fc_lease_v2")
            .arg(1)
            .arg(redis_key(req.key))
            .arg(req.holder)
            .arg(req.spent)
            .arg(req.want)
            .arg(req.ttl_ms)
            .arg(req.grace_ms)
            .arg(req.key_expire_ms)
            .arg(req.period_ms.0)
            .arg(req.period_ms.1)
            .arg(rule)
            .arg(amount)
            .arg(allowance)
            .arg(look_ms)
            .arg(req.total);
        c.arg(crate::store::reports_later_arg(req.reports_later));
        // The weighted time's id, and its segments if the store may lack them.
        match req.segments {
            Some((seg, send)) => {
                c.arg(seg.id.to_string());
                c.arg(if send { seg.text() } else { String::new() });
            }
            None => {
                c.arg("").arg("");
            }
        }
        c.arg(req.foreign).arg(req.given);
        // Lease calls are rare: they wait for a replica whenever writes do,
        // so a failover does not hand out a grant twice.
        let (v, replicas) = self.fcall(&c, self.waits())?;
        if replicas < 1 {
            self.stats.unreplicated.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable(
                "the lease was not confirmed by a replica in time".into(),
            ));
        }
        match &v {
            Value::Array(a) if a.len() == 7 => match (int(&a[0]), int(&a[2]), int(&a[5])) {
                (Some(granted), Some(spent_total), Some(usable_ms)) => Ok(LeaseGrant {
                    granted,
                    spent_total,
                    usable_ms,
                    need_segments: int(&a[6]) == Some(1),
                }),
                _ => Err(unexpected("fc_lease_v2", &v)),
            },
            _ => Err(unexpected("fc_lease_v2", &v)),
        }
    }

    /// `fc_line_v1`: units of a campaign-scope rate or gap, from a token line
    /// kept at Redis's time; the fleet admits in any interval of length d at
    /// most burst + rate·(d + lookahead + a grant's life)/period
    /// (functions.lua states the bound).
    fn line(&self, req: &LineRequest<'_>) -> Result<LineGrant, StoreError> {
        let mut c = redis::cmd("FCALL");
        c.arg("fc_line_v1")
            .arg(1)
            .arg(redis_key(req.key))
            .arg(req.holder)
            .arg(req.spent)
            .arg(req.want)
            .arg(req.burst)
            .arg(req.rate)
            .arg(req.per_us)
            .arg(req.look_us)
            .arg(req.ttl_ms)
            .arg(req.grace_ms)
            .arg(req.key_expire_ms)
            .arg(crate::store::reports_later_arg(req.reports_later));
        if req.capped {
            c.arg(1);
        }
        // As lease calls: confirmed by a replica, so a failover does not
        // hand out a unit twice.
        let (v, replicas) = self.fcall(&c, self.waits())?;
        if replicas < 1 {
            self.stats.unreplicated.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable(
                "the line lease was not confirmed by a replica in time".into(),
            ));
        }
        match &v {
            Value::Array(a) if a.len() == 5 => {
                match (int(&a[0]), int(&a[1]), int(&a[2]), int(&a[3])) {
                    (Some(granted), Some(spent), Some(spent_total), Some(retry_ms)) => {
                        Ok(LineGrant {
                            granted,
                            spent,
                            spent_total,
                            retry_ms,
                        })
                    }
                    _ => Err(unexpected("fc_line_v1", &v)),
                }
            }
            _ => Err(unexpected("fc_line_v1", &v)),
        }
    }

    /// `fc_line_cap_v1`: the cap set (unless a later one is) and what the
    /// line granted, in one call on its primary.
    fn line_cap(&self, req: &LeaseCap<'_>) -> Result<LineHeld, StoreError> {
        const WHAT: &str = "fc_line_cap_v1";
        let v = self.cap_call(WHAT, req)?;
        let n: Option<Vec<u64>> = match &v {
            Value::Array(a) => a.iter().map(int).collect(),
            _ => None,
        };
        match n.as_deref() {
            Some(&[granted, wants, now_ms, cap, seq]) => Ok(LineHeld {
                granted,
                wants,
                now_ms,
                cap,
                seq,
            }),
            _ => Err(unexpected(WHAT, &v)),
        }
    }

    /// `fc_plan_v1`: adaptive pacing's plan for the current slice, made
    /// once by the first caller from the fleet's reported spend, so every
    /// node paces by one plan.
    fn plan(&self, req: &PlanRequest<'_>) -> Result<(u64, u64), StoreError> {
        let mut c = redis::cmd("FCALL");
        c.arg("fc_plan_v1")
            .arg(1)
            .arg(redis_key(req.key))
            .arg(req.anchor_ms)
            .arg(req.prev_anchor_ms)
            .arg(req.prev_line)
            .arg(req.key_expire_ms);
        // Made once per slice: confirmed by a replica as grants are, so a
        // failover does not make a second plan from another spend.
        let (v, replicas) = self.fcall(&c, self.waits())?;
        if replicas < 1 {
            self.stats.unreplicated.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable(
                "the plan was not confirmed by a replica in time".into(),
            ));
        }
        match &v {
            Value::Array(a) if a.len() == 3 => match (int(&a[0]), int(&a[1])) {
                (Some(anchor), Some(base)) => Ok((anchor, base)),
                _ => Err(unexpected("fc_plan_v1", &v)),
            },
            _ => Err(unexpected("fc_plan_v1", &v)),
        }
    }

    /// `fc_slots_v2`: this node's share of a `max_in_flight`, set (not
    /// raised) from what it holds and wants, Σ granted ≤ max; a call older
    /// than one applied changes nothing (`seq`), so a late retry cannot
    /// give slots back twice.
    fn slots(&self, req: &SlotsRequest<'_>) -> Result<SlotsGrant, StoreError> {
        let mut c = redis::cmd("FCALL");
        c.arg("fc_slots_v2")
            .arg(1)
            .arg(redis_key(req.key))
            .arg(req.holder)
            .arg(req.seq)
            .arg(req.used)
            .arg(req.want)
            .arg(req.max)
            .arg(req.ttl_ms)
            .arg(req.hold_ms)
            .arg(req.key_expire_ms);
        let (v, replicas) = self.fcall(&c, self.waits())?;
        if replicas < 1 {
            self.stats.unreplicated.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable(
                "the slots call was not confirmed by a replica in time".into(),
            ));
        }
        match &v {
            Value::Array(a) if a.len() == 4 => match (int(&a[0]), int(&a[3])) {
                (Some(granted), Some(target)) => Ok(SlotsGrant { granted, target }),
                _ => Err(unexpected("fc_slots_v2", &v)),
            },
            _ => Err(unexpected("fc_slots_v2", &v)),
        }
    }

    /// `fc_slots_cap_v1`: the cap set (unless a later one is) and what the
    /// live holders hold, in one call on the lease's primary.
    fn slots_cap(&self, req: &LeaseCap<'_>) -> Result<SlotsHeld, StoreError> {
        const WHAT: &str = "fc_slots_cap_v1";
        let v = self.cap_call(WHAT, req)?;
        let n: Option<Vec<u64>> = match &v {
            Value::Array(a) => a.iter().map(int).collect(),
            _ => None,
        };
        match n.as_deref() {
            Some(&[held, demand, hold_ms, now_ms, cap, seq]) => Ok(SlotsHeld {
                held,
                demand,
                hold_ms,
                now_ms,
                cap,
                seq,
            }),
            _ => Err(unexpected(WHAT, &v)),
        }
    }

    /// One HGETALL of the lease hash, the `s:<holder>` fields summed: a read
    /// for a delivery or usage answer, never on a decision's path.
    fn lease_spent(&self, key: &[u8]) -> Result<u64, StoreError> {
        let mut c = redis::cmd("HGETALL");
        c.arg(redis_key(key));
        let v = self.query("HGETALL lease", c)?;
        // RESP2 answers a flat array, RESP3 a map.
        let pairs: Vec<(&Value, &Value)> = match &v {
            Value::Array(flat) => flat
                .chunks(2)
                .filter_map(|p| match p {
                    [f, n] => Some((f, n)),
                    _ => None,
                })
                .collect(),
            Value::Map(m) => m.iter().map(|(f, n)| (f, n)).collect(),
            _ => return Err(unexpected("HGETALL lease", &v)),
        };
        let mut spent = 0u64;
        for (f, n) in pairs {
            // Every holder's spent, the units it committed of others'
            // holds (`o:`), and the folded holders' in sum (`~S`).
            if bytes(f).is_some_and(|f| f.starts_with(b"s:") || f.starts_with(b"o:") || f == b"~S")
            {
                let n = int(n).ok_or_else(|| unexpected("HGETALL lease", &v))?;
                spent = spent.saturating_add(n);
            }
        }
        Ok(spent)
    }

    /// `RPUSH` to the node's mailbox (`fc:{m:<nonce>}`, a list) with its
    /// expiry an hour on: one call per commit of a reservation another
    /// node made (affinity routing makes them rare).
    fn notify(&self, nonce: u32, notice: &[u8]) -> Result<(), StoreError> {
        let key = mailbox_key(nonce);
        let mut p = redis::pipe();
        p.cmd("RPUSH").arg(&key).arg(notice).ignore();
        p.cmd("PEXPIRE").arg(&key).arg(3_600_000).ignore();
        self.pipe("RPUSH notice", p).map(drop)
    }

    /// `LPOP key count` (Redis 6.2): one call per sweep, answered nil
    /// when the mailbox is empty.
    fn take_notices(&self, nonce: u32, most: usize) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut c = redis::cmd("LPOP");
        c.arg(mailbox_key(nonce)).arg(most.max(1));
        let v = self.query("LPOP notices", c)?;
        match v {
            Value::Nil => Ok(Vec::new()),
            Value::Array(items) => Ok(items.iter().filter_map(bytes).collect()),
            other => Err(unexpected("LPOP notices", &other)),
        }
    }
}

impl RedisStore {
    /// A cap function's call (`fc_slots_cap_v1`, `fc_line_cap_v1`: the
    /// same arguments), confirmed by a replica: a cap lowered must survive
    /// a failover, else the region's nodes could be granted up to the old
    /// cap while the tier was told less.
    fn cap_call(&self, what: &str, req: &LeaseCap<'_>) -> Result<Value, StoreError> {
        let mut c = redis::cmd("FCALL");
        c.arg(what)
            .arg(1)
            .arg(redis_key(req.key))
            .arg(req.seq)
            .arg(req.cap)
            .arg(req.key_expire_ms);
        let (v, replicas) = self.fcall(&c, self.waits())?;
        if replicas < 1 {
            self.stats.unreplicated.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable(format!(
                "{what} was not confirmed by a replica in time"
            )));
        }
        Ok(v)
    }
}
