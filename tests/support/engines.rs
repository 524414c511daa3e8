//! Engines in one process on every place a record can live (issue 46): one
//! node on memory or RocksDB, and fleets of engines on one `SharedMemory`
//! in shared mode and in owner mode. A scenario written once runs on each
//! ([`Fleet::node`] picks the node a request goes to, as a fleet's router
//! or the HTTP front's forwarding would), on one manual clock the store
//! reads too (µs), so nothing depends on the machine's speed.

use std::sync::Arc;

use freqcap::engine::{
    CommitRequest, Engine, EngineOptions, Fleet as Mode, ScreenCandidate, ScreenOutcome,
    ScreenRequest,
};
use freqcap::model::{CampaignDef, from_json};
use freqcap::store::{Durability, MemoryStore, RocksStore, SharedMemory, Store};
use freqcap::{Clock, ManualClock};

/// 2023-11-14T22:13:20Z.
pub const T0: u64 = 1_700_000_000_000_000_000;
pub const SEC: u64 = 1_000_000_000;
pub const MS: u64 = 1_000_000;

pub type Node = Engine<Arc<ManualClock>>;

/// Where the records live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One node, the in-memory store.
    Memory,
    /// One node, RocksDB in a temporary directory.
    Rocks,
    /// Two nodes on one shared store, shared mode: requests alternate.
    Shared,
    /// Two nodes on one shared store, owner mode: a user's requests go to
    /// its owner.
    Owned,
}

/// Every kind, in the order scenarios run on them.
pub const KINDS: [Kind; 4] = [Kind::Memory, Kind::Rocks, Kind::Shared, Kind::Owned];

/// Engines of one kind, on one clock.
pub struct Fleet {
    pub kind: Kind,
    pub nodes: Vec<Node>,
    pub clock: Arc<ManualClock>,
    /// Requests sent so far: shared mode alternates nodes by it.
    turn: std::sync::atomic::AtomicUsize,
    _dir: Option<tempfile::TempDir>,
}

/// How far the clock moves between owner-mode membership renewals (a
/// node renews every quarter of its 2 s lease).
const RENEW_STEP: u64 = 400 * MS;

impl Fleet {
    /// Engines of `kind` (two for a shared store), joined and owning users
    /// if in owner mode.
    pub fn new(kind: Kind) -> Fleet {
        let clock = Arc::new(ManualClock::new(T0));
        let mut dir = None;
        let nodes = match kind {
            Kind::Memory => vec![open(Arc::new(MemoryStore::new()), &clock, options(0, kind))],
            Kind::Rocks => {
                let d = tempfile::tempdir().expect("a temporary directory");
                let store = Arc::new(RocksStore::open(d.path(), Durability::Wal).expect("rocksdb"));
                dir = Some(d);
                vec![open(store, &clock, options(0, kind))]
            }
            Kind::Shared | Kind::Owned => {
                let c = clock.clone();
                let store = Arc::new(SharedMemory::with_clock(move || c.now() / 1_000));
                (0..2)
                    .map(|i| open(store.clone(), &clock, options(i, kind)))
                    .collect()
            }
        };
        let fleet = Fleet {
            kind,
            nodes,
            clock,
            turn: Default::default(),
            _dir: dir,
        };
        if kind == Kind::Owned {
            fleet.join();
        }
        fleet
    }

    /// Owner mode: every node joins, then the clock moves until each owns
    /// users and no user is between owners (a joiner owns nothing for a
    /// lease, and a change of owners holds its users a margin).
    fn join(&self) {
        for _ in 0..40 {
            self.renew();
            let settled = (0..64).all(|u| {
                let owners = self
                    .nodes
                    .iter()
                    .filter(|n| owns(n, &format!("u{u}")))
                    .count();
                owners == 1
            });
            if settled
                && self
                    .nodes
                    .iter()
                    .all(|n| (0..64).any(|u| owns(n, &format!("u{u}"))))
            {
                return;
            }
            self.clock.advance(RENEW_STEP);
        }
        panic!("owner mode: the nodes never came to own every user");
    }

    /// Owner mode: every node renews its lease (nothing otherwise).
    fn renew(&self) {
        for n in &self.nodes {
            n.renew_membership().expect("a membership renewal");
        }
    }

    /// Moves the clock by `d`, renewing owner-mode memberships as their
    /// renewer would, then lets every node's sweeper run once.
    pub fn advance(&self, d: u64) {
        let mut left = d;
        while left > 0 {
            let step = left.min(RENEW_STEP);
            self.clock.advance(step);
            self.renew();
            left -= step;
        }
        self.tick();
    }

    /// Every node's periodic work: its sweep and, on a shared store, its
    /// cluster tick (leases renewed, spend and given-up holds reported).
    pub fn tick(&self) {
        for n in &self.nodes {
            n.sweep();
            n.cluster_tick().expect("a cluster tick");
        }
    }

    /// The node a request about `user` goes to: in owner mode its owner;
    /// in shared mode each node in turn (any node decides on any user).
    pub fn node(&self, user: &str) -> &Node {
        match self.kind {
            Kind::Memory | Kind::Rocks => &self.nodes[0],
            Kind::Owned => self
                .nodes
                .iter()
                .find(|n| owns(n, user))
                .expect("every user has an owner once joined"),
            Kind::Shared => {
                let t = self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                &self.nodes[t % self.nodes.len()]
            }
        }
    }

    /// Screens `req` (about `user`) where it goes ([`Fleet::node`]). In
    /// owner mode a user being handed over is refused by its old owner ("no
    /// longer owns") and by its new one for a margin: the clock then moves
    /// a renewal step and the owner is asked again, as a client retries.
    /// Returns the node that answered.
    pub fn screen(&self, user: &str, req: &ScreenRequest) -> (&Node, ScreenOutcome) {
        for _ in 0..50 {
            let n = self.node(user);
            match n.screen(req) {
                Ok(s) => return (n, s),
                Err(freqcap::engine::EngineError::Store(e)) if self.kind == Kind::Owned => {
                    eprintln!("{user} is between owners ({e}): retrying");
                    self.advance(RENEW_STEP);
                }
                Err(e) => panic!("screens: {e}"),
            }
        }
        panic!("{user} found no owner within 50 renewals");
    }

    /// The node id (`n0`, `n1`) that owns `user` now ([`Fleet::node`]).
    pub fn owner_name(&self, user: &str) -> String {
        let n = self.node(user);
        let i = self
            .nodes
            .iter()
            .position(|m| std::ptr::eq(m, n))
            .unwrap_or(0);
        format!("n{i}")
    }

    /// Defines campaign `name` on every node's view (written through one).
    pub fn campaign(&self, name: &str, json: &str) {
        let def: CampaignDef = from_json(json).expect("test campaign is valid");
        self.nodes[0].put_campaign(name, def).expect("put campaign");
        // Other nodes read the shared definitions at their tick.
        self.tick();
    }
}

/// Owner mode: whether node `n` owns `user` now.
fn owns(n: &Node, user: &str) -> bool {
    matches!(
        n.owner_of_user(user),
        Some(freqcap::cluster::owners::Owner::Me { .. })
    )
}

fn options(i: usize, kind: Kind) -> EngineOptions {
    EngineOptions {
        node_id: format!("n{i}"),
        // Distinct per node, fixed per run: made ids are reproducible.
        id_nonce: Some(0x1000 + i as u32),
        fleet: match kind {
            Kind::Owned => Mode::Owner {
                advertise: format!("127.0.0.1:{}", 9000 + i),
            },
            _ => Mode::Shared,
        },
        ..EngineOptions::default()
    }
}

fn open(store: Arc<dyn Store>, clock: &Arc<ManualClock>, options: EngineOptions) -> Node {
    Engine::open(store, clock.clone(), options).expect("the engine opens")
}

/// A reserving screen of `campaigns` for `user` (1 s to commit).
pub fn screen(user: &str, campaigns: &[&str]) -> ScreenRequest {
    screen_of(Some(user), &[], campaigns)
}

/// A reserving screen of `campaigns` for `user` (if any) and other
/// identities `ids` (kind, id), 1 s to commit.
pub fn screen_of(user: Option<&str>, ids: &[(&str, &str)], campaigns: &[&str]) -> ScreenRequest {
    ScreenRequest {
        priority: Default::default(),
        user: user.map(str::to_owned),
        ids: ids
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        candidates: campaigns
            .iter()
            .map(|c| ScreenCandidate {
                campaign: (*c).to_owned(),
                cost: None,
            })
            .collect(),
        reserve: true,
        ttl_ms: Some(1000),
        reservation_id: None,
        fingerprint: None,
    }
}

/// A commit of `campaign`.
pub fn commit(campaign: &str) -> CommitRequest {
    CommitRequest {
        campaigns: vec![campaign.to_owned()],
        ..CommitRequest::default()
    }
}

/// Campaign `json`, which the test knows is valid.
pub fn campaign_def(json: &str) -> CampaignDef {
    from_json(json).expect("test campaign is valid")
}

/// One node on the in-memory store, its clock at `at`.
pub fn memory_node(at: u64) -> (Node, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(at));
    (
        open(
            Arc::new(MemoryStore::new()),
            &clock,
            EngineOptions::default(),
        ),
        clock,
    )
}

/// A candidate's denial as a test compares it: (campaign, cap, retry
/// after in ns).
pub type Denial = Option<(String, String, Option<u128>)>;

/// What denied each candidate of `s` (`None`: eligible).
pub fn denials(s: &ScreenOutcome) -> Vec<Denial> {
    s.results
        .iter()
        .map(|r| {
            r.denied_by
                .as_ref()
                .map(|d| (d.campaign.to_string(), d.cap.clone(), d.retry_after))
        })
        .collect()
}
