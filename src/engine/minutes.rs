//! A campaign's minutes as data (docs/semantics.md §7.4): the buckets, a
//! timeline's map of them and the impressions-per-user histogram. A leaf:
//! `registry.rs` keeps them beside each campaign, `timeline.rs` fills,
//! flushes and answers them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::clock::Nanos;

/// One minute in ns.
pub const MINUTE: Nanos = 60_000_000_000;

/// Most minutes kept per campaign: two 31-day periods (a monthly budget's
/// current and previous one), at 24 bytes each at most 2.1 MB for a
/// campaign active every minute; pruned to two periods by the sweeper.
const MAX_MINUTES: usize = 2 * 31 * 1440;

/// One minute's activity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// Budget spend committed (final costs).
    pub spend: u64,
    /// Commits won: impressions.
    pub commits: u64,
    /// Candidates denied by one of the campaign's items.
    pub denied: u64,
}

/// A campaign's minutes, by minute since the epoch.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub minutes: BTreeMap<u64, Bucket>,
    /// Changed since it was last written.
    pub dirty: bool,
    /// The campaign's denial count (its `CampaignCounts`) when last read:
    /// denials reach the minutes as the count's growth, read by the
    /// sweeper every second and before a timeline is answered, so a screen
    /// never takes this lock.
    pub denied_seen: u64,
    /// With a shared store: what this node counted since its last flush to
    /// the fleet's timeline.
    pub pending: BTreeMap<u64, Bucket>,
}

impl Timeline {
    pub fn add(&mut self, now: Nanos, spend: u64, commits: u64, denied: u64) {
        for map in [&mut self.minutes, &mut self.pending] {
            let b = map.entry(now / MINUTE).or_default();
            b.spend = b.spend.saturating_add(spend);
            b.commits += commits;
            b.denied += denied;
        }
        self.dirty = true;
        while self.minutes.len() > MAX_MINUTES {
            self.minutes.pop_first();
        }
    }

    /// Drops the minutes before `from` (ns).
    pub fn prune(&mut self, from: Nanos) {
        let keep = self.minutes.split_off(&(from / MINUTE));
        if keep.len() != self.minutes.len() {
            self.dirty = true;
        }
        self.minutes = keep;
    }

    pub fn to_stored(&self) -> Vec<u8> {
        serde_json::to_vec(&self.minutes.iter().collect::<Vec<_>>()).unwrap_or_default()
    }

    pub fn from_stored(v: &[u8]) -> Result<Timeline, String> {
        let minutes: Vec<(u64, Bucket)> = serde_json::from_slice(v).map_err(|e| e.to_string())?;
        Ok(Timeline {
            minutes: minutes.into_iter().collect(),
            dirty: false,
            denied_seen: 0,
            pending: BTreeMap::new(),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerUser {
    pub cap: String,
    pub limit: u64,
    /// `users[k]`: users who used `k` of the cap (`k` = 0..=limit, at most
    /// 100 buckets).
    pub users: Vec<u64>,
}
