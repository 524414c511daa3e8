//! Users across regions at the global tier (docs/regions.md, "Users across
//! regions"): plain commands, grouped by slot (each user's keys share one),
//! in one pipeline to one Redis or one per slot to a cluster, all sent at
//! once.
//!
//! - `fc:{rt:<user>}:h`, the user's home region (`SET NX GET`: the first
//!   region to claim it).
//! - `fc:{rt:<user>}:c`, a hash of counts: one field per counting node
//!   process, campaign, event type and cost (its writer's alone, so a
//!   write never loses another's increment), merged by sum.
//! - `fc:{rt:<user>}:a`, a hash of how far each region applied each field.
//! - `fc:{rth:<home>}`, the set of a home's users other regions counted.

use redis::Value;

use super::conn::{RedisStore, bytes, int, pairs, unexpected};
use crate::store::{StoreError, Travel, TravelField, TravelSync, TravelView};

fn user_key(user: &str, part: &str) -> String {
    format!("fc:{{rt:{user}}}:{part}")
}

fn home_set(home: &str) -> String {
    format!("fc:{{rth:{home}}}")
}

/// A hash's fields as counts; a field that is no count is skipped.
fn fields(v: &Value) -> Result<Vec<TravelField>, StoreError> {
    let p = pairs(v).ok_or_else(|| unexpected("HGETALL travel", v))?;
    Ok(p.into_iter()
        .filter_map(|(f, n)| Some((bytes(f)?, int(n)?)))
        .collect())
}

impl Travel for RedisStore {
    fn claim_homes(
        &self,
        region: &str,
        users: &[&str],
        keep_ms: u64,
    ) -> Result<Vec<String>, StoreError> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        // One group per user: each user's keys are a slot of their own.
        let groups = users
            .iter()
            .map(|u| {
                let mut c = redis::cmd("SET");
                c.arg(user_key(u, "h"))
                    .arg(region)
                    .arg("NX")
                    .arg("GET")
                    .arg("PX")
                    .arg(keep_ms.max(1));
                vec![c]
            })
            .collect();
        let answers = self.pipes("SET travel homes", groups)?;
        // Nil: this call set it; else the home some region set first.
        answers
            .iter()
            .map(|group| match group.as_slice() {
                [v] => Ok(match bytes(v) {
                    Some(b) => String::from_utf8_lossy(&b).into_owned(),
                    None => region.to_owned(),
                }),
                _ => Err(unexpected("SET travel homes", &Value::Array(group.clone()))),
            })
            .collect()
    }

    fn travel_sync(&self, users: &[TravelSync<'_>]) -> Result<Vec<TravelView>, StoreError> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        // One group per user (its keys share a slot), and one per home
        // whose set of travellers grows (another slot).
        let mut groups = Vec::with_capacity(users.len() + 1);
        let mut homes: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        for s in users {
            let mut g = Vec::with_capacity(6);
            let (c, a) = (user_key(s.user, "c"), user_key(s.user, "a"));
            for (key, set) in [(&c, s.counts), (&a, s.applied)] {
                if set.is_empty() {
                    continue;
                }
                let mut h = redis::cmd("HSET");
                h.arg(key);
                for (f, n) in set {
                    h.arg(f.as_slice()).arg(*n);
                }
                g.push(h);
                let mut e = redis::cmd("PEXPIRE");
                e.arg(key).arg(s.keep_ms.max(1));
                g.push(e);
            }
            if s.home != s.here {
                homes.entry(s.home).or_default().push(s.user);
            }
            for key in [&c, &a] {
                let mut h = redis::cmd("HGETALL");
                h.arg(key);
                g.push(h);
            }
            groups.push(g);
        }
        let keep_ms = users.iter().map(|s| s.keep_ms).max().unwrap_or(1).max(1);
        for (home, travellers) in &homes {
            let mut add = redis::cmd("SADD");
            add.arg(home_set(home)).arg(travellers);
            let mut e = redis::cmd("PEXPIRE");
            e.arg(home_set(home)).arg(keep_ms);
            groups.push(vec![add, e]);
        }
        let answers = self.pipes("HGETALL travel", groups)?;
        // A user's group ends with its two HGETALLs.
        answers[..users.len()]
            .iter()
            .map(|group| match group.as_slice() {
                [.., c, a] => Ok(TravelView {
                    counts: fields(c)?,
                    applied: fields(a)?,
                }),
                _ => Err(unexpected("HGETALL travel", &Value::Array(group.clone()))),
            })
            .collect()
    }

    fn travellers_of(&self, home: &str, most: usize) -> Result<Vec<String>, StoreError> {
        let mut c = redis::cmd("SRANDMEMBER");
        c.arg(home_set(home)).arg(most.max(1));
        let v = self.query("SRANDMEMBER travellers", c)?;
        let Value::Array(users) = &v else {
            return Err(unexpected("SRANDMEMBER travellers", &v));
        };
        Ok(users
            .iter()
            .filter_map(bytes)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .collect())
    }
}
