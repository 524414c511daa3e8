//! Owner mode's membership (docs/cluster.md, "Owner mode"): which live node
//! owns a user, so that one node decides on each user's record from memory.
//!
//! Members hold leases in one Redis hash (`fc_member_v1`): a node joins with
//! a new epoch, owns nothing until every other member has read of it (its
//! `active_from`, one lease ahead), and renews every [`RENEW_EVERY`]. A user
//! is owned by the live member with the highest rendezvous score of the
//! user's hash and the member's name, so a member joining or leaving moves
//! only the users it takes or had (about 1/N of them).
//!
//! Every node computes owners from its own copy of the members, at the
//! cluster's time. A user whose owner changes within [`MARGIN`] of now has
//! none for that while (answered 503, retried by the client): the old owner
//! stops deciding before the new one starts. A node whose copy is older than
//! [`MAX_VIEW_AGE`] (it cannot reach Redis), or whose own lease ends within
//! [`MARGIN`], owns nothing. What a paused owner decided before its pause
//! cannot be written after its successor claimed the record: writes carry a
//! fencing token, the latest change of owners the writer knows of
//! ([`Owners::owner`]), and Redis refuses one below the record's
//! (`fc_cas_v2`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use super::bounded::{self, Balance, EPSILON, HEAVY_KEYS, Weights, score};
use crate::clock::{MS, Nanos};
use crate::store::{HeatReport, Membership, Shared, StoreError};

/// Where a fleet keeps a user's open reservations (`reservations`,
/// docs/cluster.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FleetMode {
    /// In the user's record in Redis: any node decides on any user, each
    /// decision a compare-and-set (a screen and a commit: ~2 calls an ad).
    #[default]
    Shared,
    /// In the memory of the user's owner, one live node: screens cost no
    /// Redis call, a commit one; other nodes forward to the owner, and an
    /// owner's kill -9 loses its open reservations (as one node's does).
    Owner,
}

impl std::str::FromStr for FleetMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "shared" => Ok(FleetMode::Shared),
            "owner" => Ok(FleetMode::Owner),
            _ => Err(format!("reservations must be shared or owner, got {s:?}")),
        }
    }
}

/// A member's lease. Renewed every quarter of it, so a member's copy of the
/// others (at most [`MAX_VIEW_AGE`] old) always sees a live member's lease
/// running at least 1 s past it.
pub const LEASE_MS: u64 = 2_000;

/// How often a node renews its lease and reads the members.
pub const RENEW_EVERY: Duration = Duration::from_millis(LEASE_MS / 4);

/// A copy of the members older than this is not used: the node owns nothing
/// until it reads them again (half a lease: a live member it believes gone
/// has renewed within the last quarter).
pub const MAX_VIEW_AGE: Nanos = LEASE_MS * MS / 2;

/// Around a change of owner, how long neither node decides for the users it
/// moves: covers the cluster time's error between nodes (under a ms) and a
/// decision's own length (a Redis call: `redis_timeout_ms`, 100 by default).
pub const MARGIN: Nanos = 250 * MS;

/// How often a node reports its heaviest users and reads the fleet's table
/// of them (`fc_heat_v1`), at a renewal: every fourth, 2 s.
const HEAT_EVERY: Nanos = 4 * (LEASE_MS / 4) * MS;

/// A new table of heavy users is made at most this often: each moves the
/// heavy users whose place changed (503 for [`MARGIN`] each side, their
/// copies read again; on the Zipf users of `bounded::tests`, a table of
/// weights ±10 % off the last moved none of them), so not more often than
/// loads shift.
pub const TABLE_EVERY_MS: u64 = 30_000;

/// A new table applies this long after it is made: every node reads the
/// tables at least every [`TABLES_MAX_AGE`], and places nothing by an older
/// copy, so all have it before it applies (6 s > 4 s + [`MARGIN`]).
pub const TABLE_AHEAD_MS: u64 = 6_000;

/// A node whose copy of the tables is older than this owns nothing (two
/// reports missed).
pub const TABLES_MAX_AGE: Nanos = 2 * HEAT_EVERY;

/// How many users a node counts at once: past it, counts are halved and
/// the ones at zero dropped (a user that was heavy stays among them).
const HEAT_TRACKED: usize = 4 * HEAVY_KEYS;

/// One member, as the members hash says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub node: String,
    /// Where its HTTP API is reached (requests for its users go there).
    pub addr: String,
    pub epoch: u64,
    /// From when it owns users (cluster time, ns).
    pub active_from: Nanos,
    /// When its lease ends (cluster time, ns).
    pub expiry: Nanos,
    /// Its name's hash, mixed into every score.
    seed: u64,
}

impl Member {
    /// Parses "epoch active_from_ms expiry_ms addr" (`fc_member_v1`).
    fn parse(node: String, value: &str) -> Option<Member> {
        let mut parts = value.splitn(4, ' ');
        let epoch = parts.next()?.parse().ok()?;
        let active_from: u64 = parts.next()?.parse().ok()?;
        let expiry: u64 = parts.next()?.parse().ok()?;
        let addr = parts.next()?.to_owned();
        Some(Member {
            seed: name_hash(&node),
            node,
            addr,
            epoch,
            active_from: active_from.saturating_mul(MS),
            expiry: expiry.saturating_mul(MS),
        })
    }

    fn live_at(&self, t: Nanos) -> bool {
        self.active_from <= t && t < self.expiry
    }
}

/// FNV-1a: a member's seed must be the same on every node and every build
/// (std's hashers promise neither).
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Who decides on a key now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This node; `epoch` is the fencing token its claims and writes carry
    /// ([`Owners::owner`]).
    Me { epoch: u64 },
    /// Another member: its name and address.
    Other { node: String, addr: String },
    /// No one for now (the reason); the caller retries shortly.
    Unsettled(&'static str),
}

/// The fleet's tables of heavy users, as this node last read them.
#[derive(Debug, Clone, Default)]
pub struct Tables {
    /// When they were read (cluster time, ns; 0: never).
    pub read_at: Nanos,
    /// Each table with the instant it applies from, earliest first.
    pub list: Vec<(Nanos, Arc<Weights>)>,
}

impl Tables {
    /// The tables in a `fc_heat_v1` answer, read at `now_ms`.
    fn parse(now_ms: u64, texts: [Option<&str>; 2]) -> Tables {
        let mut list: Vec<(Nanos, Arc<Weights>)> = texts
            .into_iter()
            .flatten()
            .filter_map(bounded::parse_table)
            .map(|(from, w)| (from.saturating_mul(MS), Arc::new(w)))
            .collect();
        list.sort_by_key(|(from, _)| *from);
        Tables {
            read_at: now_ms.saturating_mul(MS),
            list,
        }
    }

    /// The table that applies at `t`, by its index in `list`.
    fn at(&self, t: Nanos) -> Option<usize> {
        self.list.iter().rposition(|(from, _)| *from <= t)
    }
}

/// Placements already computed for a view, by (table, live members): a
/// view lives for one renewal (0.5 s), and a placement takes ~20 µs to
/// make for 256 heavy users.
#[derive(Debug, Default)]
struct Placed(RwLock<Vec<PlacedBy>>);

/// A placement, by the index of its table and its live members.
type PlacedBy = (usize, Vec<usize>, Arc<Balance>);

impl Clone for Placed {
    fn clone(&self) -> Placed {
        Placed::default()
    }
}

/// A node's copy of the members.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// This node's epoch (0: not a member yet, or its lease was lost).
    pub epoch: u64,
    /// When the copy was read (cluster time, ns).
    pub read_at: Nanos,
    pub members: Vec<Member>,
    /// The tables of heavy users owners are placed by (src/cluster/bounded.rs).
    pub tables: Arc<Tables>,
    placed: Placed,
}

impl View {
    /// The member owning `h` at `t`, if any is live then: by the table that
    /// applies then, with bounded loads; by plain rendezvous before any.
    fn pick(&self, h: u128, t: Nanos) -> Option<&Member> {
        let Some(table) = self.tables.at(t) else {
            return self
                .members
                .iter()
                .filter(|m| m.live_at(t))
                .max_by_key(|m| (score(h, m.seed), m.seed));
        };
        let live: Vec<usize> = (0..self.members.len())
            .filter(|i| self.members[*i].live_at(t))
            .collect();
        let balance = self.balance(table, &live);
        balance.owner(h).map(|j| &self.members[live[j]])
    }

    /// The placement of table `table` over the members `live`.
    fn balance(&self, table: usize, live: &[usize]) -> Arc<Balance> {
        let found = |v: &Vec<PlacedBy>| {
            v.iter()
                .find(|(t, l, _)| *t == table && l.as_slice() == live)
                .map(|(_, _, b)| b.clone())
        };
        if let Some(b) = found(&self.placed.0.read().unwrap_or_else(PoisonError::into_inner)) {
            return b;
        }
        let seeds: Vec<u64> = live.iter().map(|i| self.members[*i].seed).collect();
        let b = Arc::new(Balance::new(&seeds, &self.tables.list[table].1, EPSILON));
        let mut placed = self
            .placed
            .0
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(b) = found(&placed) {
            return b;
        }
        placed.push((table, live.to_vec(), b.clone()));
        b
    }

    /// Every instant at which users may have changed owner: a member
    /// becoming active or its lease ending, a table applying.
    fn changes(&self) -> impl Iterator<Item = Nanos> + '_ {
        self.members
            .iter()
            .flat_map(|m| [m.active_from, m.expiry])
            .chain(self.tables.list.iter().map(|(from, _)| *from))
    }

    /// The latest instant at or before `now` at which users may have
    /// changed owner.
    fn last_change(&self, now: Nanos) -> Nanos {
        self.changes().filter(|t| *t <= now).max().unwrap_or(0)
    }

    /// Who decides on key `h` at `now`, as `me` sees it.
    pub fn owner(&self, me: &str, h: u128, now: Nanos) -> Owner {
        if self.epoch == 0 {
            return Owner::Unsettled("this node is joining the fleet (owner mode)");
        }
        if now > self.read_at.saturating_add(MAX_VIEW_AGE) {
            return Owner::Unsettled("this node cannot read the fleet's members from Redis");
        }
        if now > self.tables.read_at.saturating_add(TABLES_MAX_AGE) {
            return Owner::Unsettled("this node cannot read the fleet's table of heavy users");
        }
        let (a, b) = (self.pick(h, now), self.pick(h, now.saturating_add(MARGIN)));
        let (Some(a), Some(b)) = (a, b) else {
            return Owner::Unsettled("no member of the fleet is live");
        };
        if a.node != b.node || a.epoch != b.epoch {
            return Owner::Unsettled("this user's owner is changing; retry");
        }
        if a.node != me {
            return Owner::Other {
                node: a.node.clone(),
                addr: a.addr.clone(),
            };
        }
        if a.epoch != self.epoch {
            // An earlier process of this name, whose lease still runs.
            return Owner::Unsettled("this node's previous process still holds its lease");
        }
        Owner::Me { epoch: self.epoch }
    }
}

/// Which copies of users a node keeps after owners changed.
#[derive(Debug)]
pub struct DropPlan {
    /// This node's epoch changed: it keeps none.
    all: bool,
    times: Vec<Nanos>,
    last: Nanos,
    me: String,
    view: Arc<View>,
}

impl DropPlan {
    /// Whether the copy of key `h` stays: this node owned it at every
    /// change since the last drop, owns it now and still will past the
    /// margin.
    pub fn keeps(&self, h: u128) -> bool {
        !self.all
            && self.times.iter().all(|t| {
                self.view
                    .pick(h, *t)
                    .is_some_and(|m| m.node == self.me && m.epoch == self.view.epoch)
            })
    }
}

/// This node's membership: its name, its address, and its copy of the
/// members (replaced whole by each renewal).
#[derive(Debug)]
pub struct Owners {
    node: String,
    addr: String,
    view: RwLock<Arc<View>>,
    /// The epoch, and the last change of owners, for which the users this
    /// node no longer owns were dropped from its memory
    /// ([`Owners::drop_plan`]).
    dropped: Mutex<(u64, Nanos)>,
    /// Drops made so far: a decision that saw it change while it ran does
    /// not put its copy back.
    drops: AtomicU64,
    /// The decisions this node made as owner since its last report.
    heat: Heat,
    /// The highest fencing token this node has used ([`Owners::owner`]).
    fence: AtomicU64,
}

/// Decisions counted by user, for the fleet's table of heavy users: at most
/// [`HEAT_TRACKED`] users at once (memory stays bounded whatever the users).
#[derive(Debug, Default)]
struct Heat {
    counts: Mutex<std::collections::HashMap<u128, u64>>,
    total: AtomicU64,
}

impl Heat {
    fn add(&self, h: u128) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.len() >= HEAT_TRACKED && !counts.contains_key(&h) {
            // Full: halve every count, dropping the ones at zero (amortised:
            // at most once per HEAT_TRACKED / 2 new users, most of them
            // light). A user still not let in is counted in the total.
            counts.retain(|_, c| {
                *c /= 2;
                *c > 0
            });
            if counts.len() >= HEAT_TRACKED {
                return;
            }
        }
        *counts.entry(h).or_default() += 1;
    }

    /// The total and the `top` heaviest since the last call, counts reset.
    fn take(&self, top: usize) -> (u64, Vec<(u128, u64)>) {
        let counts =
            std::mem::take(&mut *self.counts.lock().unwrap_or_else(PoisonError::into_inner));
        let total = self.total.swap(0, Ordering::Relaxed);
        let mut heavy: Vec<(u128, u64)> = counts.into_iter().collect();
        heavy.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        heavy.truncate(top);
        (total, heavy)
    }
}

impl Owners {
    pub fn new(node: &str, addr: &str) -> Owners {
        Owners {
            node: node.to_owned(),
            addr: addr.to_owned(),
            view: RwLock::new(Arc::new(View::default())),
            dropped: Mutex::new((0, 0)),
            drops: AtomicU64::new(0),
            heat: Heat::default(),
            fence: AtomicU64::new(0),
        }
    }

    /// What to drop from this node's memory, if users may have changed
    /// owner (or this node's epoch changed) since it last dropped the copies
    /// of users it does not own: a copy kept across a move away and back
    /// would miss what the other owner wrote meanwhile. The engine drops
    /// them (from its periodic tick, and before a decision if a change
    /// came since), then calls [`Owners::dropped`].
    pub fn drop_plan(&self, now: Nanos) -> Option<DropPlan> {
        let view = self.view();
        let (epoch, since) = *self.dropped.lock().unwrap_or_else(PoisonError::into_inner);
        let last = view.last_change(now);
        if epoch == view.epoch && since >= last {
            return None;
        }
        // Every instant owners changed at since the last drop: a user is
        // kept only if it was this node's throughout.
        let mut times: Vec<Nanos> = view.changes().filter(|t| *t > since && *t <= now).collect();
        times.extend([now, now.saturating_add(MARGIN)]);
        // A change before the earliest table this node still has was placed
        // by one it no longer knows (tables are kept two at a time, the
        // older dropped ≥ 24 s after the newer applied; drops run every
        // tick, so only a node stalled that long meets this): it keeps no
        // copy rather than guess, and claims its users again.
        let unknown = view
            .tables
            .list
            .first()
            .is_some_and(|(first, _)| times.iter().any(|t| t < first));
        Some(DropPlan {
            all: epoch != view.epoch || unknown,
            times,
            last,
            me: self.node.clone(),
            view,
        })
    }

    /// Whether [`Owners::drop_plan`] has something to drop (cheap: no plan
    /// is made).
    pub fn drop_due(&self, now: Nanos) -> bool {
        let view = self.view();
        let (epoch, since) = *self.dropped.lock().unwrap_or_else(PoisonError::into_inner);
        epoch != view.epoch || since < view.last_change(now)
    }

    /// Records that the copies `plan` names were dropped.
    pub fn dropped(&self, plan: &DropPlan) {
        *self.dropped.lock().unwrap_or_else(PoisonError::into_inner) = (plan.view.epoch, plan.last);
        self.drops.fetch_add(1, Ordering::AcqRel);
    }

    /// How many drops were made so far.
    pub fn drops(&self) -> u64 {
        self.drops.load(Ordering::Acquire)
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// Where other nodes forward this node's users (its HTTP address).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The current copy of the members.
    pub fn view(&self) -> Arc<View> {
        self.view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many heavy users the table that applies at `now` places (0: none
    /// applies, owners are plain rendezvous).
    pub fn heavy_users(&self, now: Nanos) -> usize {
        let tables = self.view().tables.clone();
        tables.at(now).map_or(0, |i| tables.list[i].1.heavy.len())
    }

    /// Who decides on key `h` at `now` (counted, if this node).
    ///
    /// This node's claims and writes are fenced (`fc_own_v1`, `fc_cas_v2`
    /// refuse a token below the record's) by the latest change of owners
    /// it knows of, in ms of cluster time, never lower than a token it used
    /// before. A user's new owner took it at a change no earlier than its
    /// own token, and its old owner stopped deciding a margin before that
    /// change, with a token from changes before it: the new owner's claim
    /// is always the higher, whichever of the two joined first. (Fencing by
    /// the members' join epochs, as before, refused every write of a user
    /// a table of heavy users moved from a later joiner to an earlier one:
    /// 503 until its record expired; `tests/owner_moves.rs`.) Tokens in ms
    /// are far above join epochs, so records fenced by an older build's
    /// epochs are claimed as before.
    pub fn owner(&self, h: u128, now: Nanos) -> Owner {
        let view = self.view();
        match view.owner(&self.node, h, now) {
            Owner::Me { epoch } => {
                self.heat.add(h);
                let change = (view.last_change(now) / MS).max(epoch);
                let fence = self.fence.fetch_max(change, Ordering::AcqRel).max(change);
                Owner::Me { epoch: fence }
            }
            other => other,
        }
    }

    /// Renews this node's lease (joining if it has none) and reads the
    /// members. A lease found gone is a new membership: a new epoch, and
    /// nothing owned until it is active.
    pub fn renew(&self, shared: &dyn Shared) -> Result<(), StoreError> {
        let epoch = self.view().epoch;
        let mut reply = shared.member(&self.node, &self.addr, epoch, LEASE_MS)?;
        if let Membership::Gone { .. } = reply {
            tracing::warn!(
                node = self.node,
                epoch,
                "this node's membership lease ran out (paused, or cut off from Redis): \
                 joining again with a new epoch; it owns no user until then"
            );
            self.set(View::default());
            reply = shared.member(&self.node, &self.addr, 0, LEASE_MS)?;
        }
        match reply {
            Membership::Lease {
                epoch: mine,
                now_ms,
                members,
            } => {
                if mine != epoch {
                    tracing::info!(
                        node = self.node,
                        epoch = mine,
                        "joined the fleet (owner mode)"
                    );
                }
                let members = members
                    .into_iter()
                    .filter_map(|(n, v)| Member::parse(n, &v))
                    .collect();
                let tables = self.tables(shared, mine != epoch, now_ms.saturating_mul(MS));
                self.set(View {
                    epoch: mine,
                    read_at: now_ms.saturating_mul(MS),
                    members,
                    tables,
                    placed: Placed::default(),
                });
                Ok(())
            }
            Membership::Gone { .. } => Err(StoreError::Unavailable(
                "the members hash refused a fresh join".into(),
            )),
        }
    }

    /// The fleet's tables of heavy users: once the copy is [`HEAT_EVERY`]
    /// old (and on joining), this node's report sent and the tables read
    /// anew; otherwise the copy it has. A failed call keeps the copy, which
    /// ages: past [`TABLES_MAX_AGE`] the node owns nothing.
    fn tables(&self, shared: &dyn Shared, joined: bool, now: Nanos) -> Arc<Tables> {
        let kept = self.view().tables.clone();
        if !joined && now < kept.read_at.saturating_add(HEAT_EVERY) {
            return kept;
        }
        let (total, heavy) = self.heat.take(HEAVY_KEYS);
        let report = HeatReport {
            node: &self.node,
            total,
            heavy: &heavy,
            top: HEAVY_KEYS,
            every_ms: TABLE_EVERY_MS,
            ahead_ms: TABLE_AHEAD_MS,
        };
        match shared.heat(&report) {
            Ok(t) => Arc::new(Tables::parse(
                t.now_ms,
                [t.prev.as_deref(), t.next.as_deref()],
            )),
            Err(e) => {
                tracing::warn!(node = self.node, error = %e, "could not report this node's load (fc_heat_v1)");
                kept
            }
        }
    }

    /// Ends this node's lease now (a node stopping, after its last
    /// decision): the others take its users when they next read the
    /// members, within [`RENEW_EVERY`], instead of a lease later.
    pub fn leave(&self, shared: &dyn Shared) -> Result<(), StoreError> {
        let epoch = self.view().epoch;
        self.set(View::default());
        if epoch == 0 {
            return Ok(());
        }
        shared.member(&self.node, &self.addr, epoch, 0).map(drop)
    }

    fn set(&self, v: View) {
        *self.view.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    fn member(node: &str, epoch: u64, from: Nanos, expiry: Nanos) -> Member {
        Member::parse(
            node.into(),
            &format!("{epoch} {} {} 127.0.0.1:1", from / MS, expiry / MS),
        )
        .unwrap()
    }

    fn view(epoch: u64, members: Vec<Member>) -> View {
        View {
            epoch,
            read_at: 100 * S,
            members,
            tables: Arc::new(Tables {
                read_at: 100 * S,
                list: Vec::new(),
            }),
            placed: Placed::default(),
        }
    }

    /// Each key has one owner, the same from every member's copy; a third
    /// member takes about a third of the keys, and moves no key between
    /// the other two.
    #[test]
    fn rendezvous_moves_only_what_a_new_member_takes() {
        let two = vec![member("a", 1, 0, 200 * S), member("b", 2, 0, 200 * S)];
        let mut three = two.clone();
        three.push(member("c", 3, 0, 200 * S));
        let (v2, v3) = (view(1, two), view(1, three));
        let (mut moved, mut to_c) = (0, 0);
        for k in 0..3000u128 {
            let h = k.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834);
            let before = v2.pick(h, 100 * S).unwrap().node.clone();
            let after = v3.pick(h, 100 * S).unwrap().node.clone();
            if before != after {
                moved += 1;
                assert_eq!(after, "c", "a key moved between the two old members");
                to_c += 1;
            }
        }
        assert_eq!(moved, to_c);
        assert!((800..1200).contains(&to_c), "c took {to_c} of 3000");
    }

    /// A member joining (active from t) or leaving (lease ending at t):
    /// its keys have no owner within MARGIN before t, so the old and the
    /// new owner never decide at once.
    #[test]
    fn a_key_changing_owner_has_none_around_the_change() {
        let t = 101 * S;
        let v = view(
            1,
            vec![member("a", 1, 0, 200 * S), member("b", 2, t, 200 * S)],
        );
        let h = (0..u128::MAX)
            .find(|h| v.pick(*h, t).is_some_and(|m| m.node == "b"))
            .unwrap();
        assert_eq!(v.owner("a", h, t - 2 * MARGIN), Owner::Me { epoch: 1 });
        assert!(matches!(
            v.owner("a", h, t - MARGIN / 2),
            Owner::Unsettled(_)
        ));
        assert!(matches!(
            v.owner("b", h, t - MARGIN / 2),
            Owner::Unsettled(_)
        ));
        assert_eq!(
            v.owner("a", h, t),
            Owner::Other {
                node: "b".into(),
                addr: "127.0.0.1:1".into()
            }
        );
        // b's lease ends at 200 s: a owns its keys again from then.
        assert!(matches!(
            v.owner("a", h, 200 * S - MARGIN / 2),
            Owner::Unsettled(_)
        ));
    }

    /// A copy of the members too old, a lost lease, or a previous process
    /// of the same name: the node owns nothing.
    #[test]
    fn a_node_unsure_of_its_lease_owns_nothing() {
        let v = view(1, vec![member("a", 1, 0, 200 * S)]);
        assert_eq!(v.owner("a", 7, 100 * S), Owner::Me { epoch: 1 });
        assert!(matches!(
            v.owner("a", 7, 100 * S + MAX_VIEW_AGE + 1),
            Owner::Unsettled(_)
        ));
        assert!(matches!(
            view(0, v.members.clone()).owner("a", 7, 100 * S),
            Owner::Unsettled(_)
        ));
        assert!(matches!(
            view(2, v.members.clone()).owner("a", 7, 100 * S),
            Owner::Unsettled(_)
        ));
    }

    /// A table applies from its instant: a heavy key goes where the bounded
    /// placement puts it, and around the change it has no owner.
    #[test]
    fn a_table_places_heavy_keys_from_its_instant() {
        let members = vec![
            member("a", 1, 0, 300 * S),
            member("b", 2, 0, 300 * S),
            member("c", 3, 0, 300 * S),
        ];
        let plain = view(1, members.clone());
        // Two keys of 45 % each, planned first: both cannot stay on one member.
        let (k1, k2) = (0..10_000u128)
            .flat_map(|a| (a + 1..a + 50).map(move |b| (a, b)))
            .find(|(a, b)| {
                plain.pick(*a, 100 * S).unwrap().node == plain.pick(*b, 100 * S).unwrap().node
            })
            .unwrap();
        let w = Weights {
            heavy: vec![(k1, 45), (k2, 45)],
            rest: 10,
        };
        let mut v = plain.clone();
        v.tables = Arc::new(Tables {
            read_at: 100 * S,
            list: vec![(110 * S, Arc::new(w))],
        });
        let (before, after) = (v.pick(k1, 105 * S).unwrap(), v.pick(k1, 115 * S).unwrap());
        assert_eq!(
            before.node,
            plain.pick(k1, 105 * S).unwrap().node,
            "plain before the table"
        );
        let (o1, o2) = (
            v.pick(k1, 115 * S).unwrap().node.clone(),
            v.pick(k2, 115 * S).unwrap().node.clone(),
        );
        assert_ne!(o1, o2, "two keys of 45 % each share no member");
        let moved = if before.node != after.node { k1 } else { k2 };
        v.read_at = 110 * S;
        v.tables = Arc::new(Tables {
            read_at: 110 * S,
            ..(*v.tables).clone()
        });
        assert_eq!(
            v.owner("a", moved, 110 * S - MARGIN / 2),
            Owner::Unsettled("this user's owner is changing; retry")
        );
        assert_eq!(v.last_change(111 * S), 110 * S);
    }

    /// A drop over a change the node's tables no longer cover keeps nothing.
    #[test]
    fn a_drop_before_the_tables_it_knows_keeps_nothing() {
        let plan_with_table_at = |from: Nanos| {
            let owners = Owners::new("a", "127.0.0.1:1");
            owners.set(view(1, vec![member("a", 1, 0, 300 * S)]));
            let first = owners.drop_plan(10 * S).expect("a new epoch");
            owners.dropped(&first);
            let mut v = view(
                1,
                vec![member("a", 1, 0, 300 * S), member("b", 2, 50 * S, 300 * S)],
            );
            v.tables = Arc::new(Tables {
                read_at: 100 * S,
                list: vec![(from, Arc::new(Weights::default()))],
            });
            owners.set(v);
            owners
                .drop_plan(100 * S)
                .expect("b joined, a table applied")
        };
        assert!(
            plan_with_table_at(60 * S).all,
            "b joined at 50 s, before the only table known"
        );
        assert!(
            !plan_with_table_at(40 * S).all,
            "every change since the last drop is covered"
        );
    }

    #[test]
    fn a_node_with_stale_tables_owns_nothing() {
        let mut v = view(1, vec![member("a", 1, 0, 300 * S)]);
        assert_eq!(v.owner("a", 7, 100 * S), Owner::Me { epoch: 1 });
        v.tables = Arc::new(Tables {
            read_at: 100 * S - TABLES_MAX_AGE - 1,
            list: Vec::new(),
        });
        assert_eq!(
            v.owner("a", 7, 100 * S),
            Owner::Unsettled("this node cannot read the fleet's table of heavy users")
        );
    }

    /// Counting stays within HEAT_TRACKED users whatever comes, and the
    /// heavy stay counted through a flood of light ones.
    #[test]
    fn heat_is_bounded_and_keeps_the_heavy() {
        let heat = Heat::default();
        let n = 20 * HEAT_TRACKED as u128;
        for h in 10..(10 + n) {
            heat.add(h);
            heat.add(2);
            if h % 4 == 0 {
                heat.add(1);
            }
        }
        assert!(heat.counts.lock().unwrap().len() <= HEAT_TRACKED);
        let (total, top) = heat.take(2);
        assert_eq!(u128::from(total), 2 * n + n / 4);
        assert_eq!(top.iter().map(|(h, _)| *h).collect::<Vec<_>>(), [2, 1]);
        assert_eq!(heat.take(2), (0, vec![]), "a report resets the counts");
    }
}
