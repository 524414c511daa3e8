//! Owners with bounded loads (docs/cluster.md, "Owner mode"): consistent
//! hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam, SODA
//! 2018), with keys weighed by the requests they bring.
//!
//! Plain rendezvous hashing gives each member about 1/n of the keys, not of
//! the load. Users' requests are skewed: of 100 000 users drawn Zipf(1.1),
//! the first brings 13 % of all requests, so on 8 members its owner carries
//! 1.8× the mean (`tests`, `plain_rendezvous_is_unbalanced`).
//! Here each member may carry at most `⌈(1 + ε) · mean⌉` of the weight:
//!
//! 1. The heavy keys the fleet measured are placed heaviest first, each on
//!    the first member of its rendezvous order with room for it, room left
//!    for an even share of the light keys (a key too heavy for any goes to
//!    the least loaded member, and the bound becomes its weight).
//! 2. Every other key (the rest: many light keys, of a weight the fleet
//!    measured in total) follows rendezvous order over the members that are
//!    *open*: the most members, least loaded first, whose load plus an
//!    even share of the rest stays within the capacity.
//!
//! The answer is a pure function of the members' seeds and the weights, so
//! every node computes the same owners from the same table without asking
//! anyone. A member joining takes the keys whose rendezvous order it now
//! heads, and displaces heavy keys only where capacities shrank: measured
//! under `1/n + ε` of the weight (`tests`, `bounded_loads_table`).

use std::collections::HashMap;

/// How far above the mean a member's load may go (Mirrokni et al.'s ε).
pub const EPSILON: f64 = 0.25;

/// What the fleet measured: the heaviest keys with their weights, and the
/// total weight of all the others.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Weights {
    pub heavy: Vec<(u128, u64)>,
    pub rest: u64,
}

/// Where keys go among one set of members.
#[derive(Debug, Clone)]
pub struct Balance {
    /// The members' seeds, in the order given.
    seeds: Vec<u64>,
    /// Each heavy key's member (an index into `seeds`).
    heavy: HashMap<u128, usize>,
    /// The members that take keys outside `heavy`.
    open: Vec<bool>,
}

impl Balance {
    /// The placement of `weights` over members of seeds `seeds` (empty:
    /// no member, no owner), each member carrying at most
    /// `⌈(1 + epsilon) · mean⌉` unless one key alone is heavier.
    pub fn new(seeds: &[u64], weights: &Weights, epsilon: f64) -> Balance {
        let n = seeds.len();
        let mut balance = Balance {
            seeds: seeds.to_vec(),
            heavy: HashMap::with_capacity(weights.heavy.len()),
            open: vec![true; n],
        };
        if n == 0 {
            return balance;
        }
        let total: u128 = weights
            .heavy
            .iter()
            .map(|(_, w)| u128::from(*w))
            .sum::<u128>()
            + u128::from(weights.rest);
        // ⌈(1 + ε) · total / n⌉, in integers where ε is a float setting.
        let cap = ((1.0 + epsilon.max(0.0)) * total as f64 / n as f64).ceil() as u128;
        // Room kept on every member for its even share of the light keys.
        let share = u128::from(weights.rest).div_ceil(n as u128);
        let mut load = vec![0u128; n];
        let mut keys = weights.heavy.clone();
        keys.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut order: Vec<usize> = (0..n).collect();
        for (h, w) in keys {
            let w = u128::from(w);
            order.sort_unstable_by_key(|i| std::cmp::Reverse((score(h, seeds[*i]), seeds[*i])));
            let to = order
                .iter()
                .copied()
                .find(|i| load[*i] + w + share <= cap)
                .unwrap_or_else(|| {
                    // Heavier than any room left: the least loaded member,
                    // first in rendezvous order among equals.
                    let least = order.iter().map(|i| load[*i]).min().unwrap_or(0);
                    order
                        .iter()
                        .copied()
                        .find(|i| load[*i] == least)
                        .unwrap_or(0)
                });
            load[to] += w;
            balance.heavy.insert(h, to);
        }
        balance.open = open_members(&load, u128::from(weights.rest), cap);
        balance
    }

    /// The member (an index into the seeds given) that owns key `h`.
    pub fn owner(&self, h: u128) -> Option<usize> {
        if let Some(i) = self.heavy.get(&h) {
            return Some(*i);
        }
        (0..self.seeds.len())
            .filter(|i| self.open[*i])
            .max_by_key(|i| (score(h, self.seeds[*i]), self.seeds[*i]))
    }
}

/// Which members take the light keys: the `k` least loaded for the largest
/// `k` whose loads plus an even share of `rest` stay within `cap`; if no
/// `k` does, the `k` that makes the largest load smallest.
fn open_members(load: &[u128], rest: u128, cap: u128) -> Vec<bool> {
    let n = load.len();
    let mut by_load: Vec<usize> = (0..n).collect();
    by_load.sort_unstable_by_key(|i| (load[*i], *i));
    // With the k least loaded open, the largest load is the k-th's plus a
    // share of the rest, or a closed member's own.
    let worst = |k: usize| {
        let open_max = load[by_load[k - 1]] + rest.div_ceil(k as u128);
        let closed_max = by_load[k..].iter().map(|i| load[*i]).max().unwrap_or(0);
        open_max.max(closed_max)
    };
    let k = (1..=n)
        .rev()
        .find(|k| load[by_load[k - 1]] + rest.div_ceil(*k as u128) <= cap)
        .unwrap_or_else(|| (1..=n).min_by_key(|k| (worst(*k), n - k)).unwrap_or(n));
    let mut open = vec![false; n];
    for i in &by_load[..k] {
        open[*i] = true;
    }
    open
}

/// How many of its heaviest keys a node reports, and a table keeps. On the
/// Zipf(1.1) users of `tests`, the 256 heaviest make 65 % of the requests;
/// a table of them is ~10 KB.
pub const HEAVY_KEYS: usize = 256;

/// A table as `fc_heat_v1` stores it (src/cluster/functions.lua): "from_ms
/// rest key weight key weight …", keys as 32 lowercase hex digits. From
/// `from_ms` (the cluster's time) owners are placed by these weights.
pub fn table_text(from_ms: u64, w: &Weights) -> String {
    let mut s = format!("{from_ms} {}", w.rest);
    for (h, weight) in &w.heavy {
        s.push_str(&format!(" {h:032x} {weight}"));
    }
    s
}

/// The table in `text` ([`table_text`]); `None` if it is not one.
pub fn parse_table(text: &str) -> Option<(u64, Weights)> {
    let mut parts = text.split(' ');
    let from = parts.next()?.parse().ok()?;
    let rest = parts.next()?.parse().ok()?;
    let mut heavy = Vec::new();
    while let Some(k) = parts.next() {
        if k.len() != 32 {
            return None;
        }
        heavy.push((
            u128::from_str_radix(k, 16).ok()?,
            parts.next()?.parse().ok()?,
        ));
    }
    Some((from, Weights { heavy, rest }))
}

/// The fleet's weights from each node's report (its total of decisions, its
/// heaviest keys): each key's weights summed, the `top` heaviest kept
/// (heaviest first, lower key first among equals), every other decision in
/// `rest`. `fc_heat_v1` merges the same way in Redis.
pub fn merge<'a>(
    reports: impl IntoIterator<Item = (u64, &'a [(u128, u64)])>,
    top: usize,
) -> Weights {
    let mut total: u64 = 0;
    let mut sums: HashMap<u128, u64> = HashMap::new();
    for (t, keys) in reports {
        total = total.saturating_add(t);
        for (h, w) in keys {
            let e = sums.entry(*h).or_default();
            *e = e.saturating_add(*w);
        }
    }
    let mut heavy: Vec<(u128, u64)> = sums.into_iter().collect();
    heavy.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    heavy.truncate(top);
    let kept: u64 = heavy
        .iter()
        .map(|(_, w)| w)
        .fold(0, |a, w| a.saturating_add(*w));
    Weights {
        heavy,
        rest: total.saturating_sub(kept),
    }
}

/// The rendezvous score of key `h` on a member of seed `seed`: SplitMix64's
/// finalizer over both, so that every bit of each moves the score.
pub(super) fn score(h: u128, seed: u64) -> u64 {
    let mut z = (h as u64) ^ ((h >> 64) as u64).rotate_left(29) ^ seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100 000 users drawn Zipf(1.1): weight of rank k ∝ k^-1.1 (in
    /// millionths of the first's), keyed by a mixed hash of the rank.
    fn zipf_users(count: u64) -> Vec<(u128, u64)> {
        (1..=count)
            .map(|k| {
                let h = (u128::from(score(u128::from(k), 0x5eed)) << 64) | u128::from(k);
                (h, (1e6 / (k as f64).powf(1.1)).round().max(1.0) as u64)
            })
            .collect()
    }

    fn seeds(n: usize) -> Vec<u64> {
        (0..n)
            .map(|i| score(u128::from(i as u64) + 1, 0x6e6f_6465))
            .collect()
    }

    /// The fleet's table: the `top` heaviest users, and the rest's total.
    fn measured(users: &[(u128, u64)], top: usize) -> Weights {
        Weights {
            heavy: users[..top].to_vec(),
            rest: users[top..].iter().map(|(_, w)| w).sum(),
        }
    }

    /// Each member's load when every user goes where `owner` says.
    fn loads(users: &[(u128, u64)], n: usize, owner: impl Fn(u128) -> usize) -> Vec<u64> {
        let mut load = vec![0; n];
        for (h, w) in users {
            load[owner(*h)] += w;
        }
        load
    }

    fn max_over_mean(load: &[u64]) -> f64 {
        let mean = load.iter().sum::<u64>() as f64 / load.len() as f64;
        *load.iter().max().unwrap() as f64 / mean
    }

    /// The share of all weight whose owner differs between two placements.
    fn moved(users: &[(u128, u64)], a: &Balance, b: &Balance) -> f64 {
        let total: u64 = users.iter().map(|(_, w)| w).sum();
        let moved: u64 = users
            .iter()
            .filter(|(h, _)| a.seeds[a.owner(*h).unwrap()] != b.seeds[b.owner(*h).unwrap()])
            .map(|(_, w)| w)
            .sum();
        moved as f64 / total as f64
    }

    /// Plain rendezvous (every member open, no heavy key): the defect the
    /// bounded placement fixes.
    #[test]
    fn plain_rendezvous_is_unbalanced() {
        let users = zipf_users(100_000);
        let ratio = |n| {
            let plain = Balance::new(&seeds(n), &Weights::default(), EPSILON);
            max_over_mean(&loads(&users, n, |h| plain.owner(h).unwrap()))
        };
        let (three, eight) = (ratio(3), ratio(8));
        eprintln!("plain rendezvous: max/mean {three:.3} on 3 members, {eight:.3} on 8");
        // On 3 the first user (13 % of the load) fits under a third by luck of
        // where the rest fell; on 8 its owner is far over the bound.
        assert!(eight > 1.0 + EPSILON, "8 members: {eight}");
    }

    /// The table issue 47 asks for: Zipf(1.1) users over 3 and 8 members,
    /// the fleet knowing the 256 heaviest. Max/mean load within 1 + ε, and a
    /// member joining moves at most 1/n + ε of the weight (n after the join).
    #[test]
    fn bounded_loads_table() {
        let users = zipf_users(100_000);
        let weights = measured(&users, 256);
        eprintln!("members  max/mean  moved on a join");
        for n in [3, 8] {
            let before = Balance::new(&seeds(n), &weights, EPSILON);
            let after = Balance::new(&seeds(n + 1), &weights, EPSILON);
            let ratio = max_over_mean(&loads(&users, n, |h| before.owner(h).unwrap()));
            let share = moved(&users, &before, &after);
            eprintln!("{n:>7}  {ratio:>8.3}  {share:>15.3}");
            assert!(ratio <= 1.0 + EPSILON, "{n} members: max/mean {ratio}");
            let bound = 1.0 / (n + 1) as f64 + EPSILON;
            assert!(share <= bound, "{n} → {}: moved {share} > {bound}", n + 1);
        }
    }

    /// A new table every 30 s from the loads measured meanwhile: with each
    /// user's count off by up to ±10 % (noise between two tables), how much
    /// of the weight changes owner. Printed for docs/cluster.md; bounded by
    /// ε so that a table does not move more than a member joining does.
    #[test]
    fn a_table_of_noisy_weights_moves_little() {
        let users = zipf_users(100_000);
        let noisy: Vec<(u128, u64)> = users
            .iter()
            .map(|(h, w)| {
                let noise = (score(*h, 0xacc) % 21) as f64 / 100.0 - 0.10;
                (*h, ((*w as f64) * (1.0 + noise)).round().max(1.0) as u64)
            })
            .collect();
        let mut sorted = noisy.clone();
        sorted.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        for n in [3, 8] {
            let a = Balance::new(&seeds(n), &measured(&users, 256), EPSILON);
            let b = Balance::new(&seeds(n), &measured(&sorted, 256), EPSILON);
            let share = moved(&users, &a, &b);
            eprintln!("{n} members: weight moved by a table of noisy weights {share:.3}");
            assert!(share <= EPSILON, "{n} members: {share}");
        }
    }

    #[test]
    fn the_same_table_gives_every_node_the_same_owners() {
        let users = zipf_users(2_000);
        let weights = measured(&users, 256);
        let mut shuffled = weights.clone();
        shuffled.heavy.reverse();
        let (a, b) = (
            Balance::new(&seeds(5), &weights, EPSILON),
            Balance::new(&seeds(5), &shuffled, EPSILON),
        );
        assert!(users.iter().all(|(h, _)| a.owner(*h) == b.owner(*h)));
    }

    #[test]
    fn a_key_heavier_than_the_capacity_has_a_member_to_itself() {
        // One key of 90 % of the weight on 4 members: it cannot fit any
        // capacity (⌈1.25 · 25 %⌉); its member takes nothing else.
        let weights = Weights {
            heavy: vec![(7, 900), (8, 20)],
            rest: 80,
        };
        let b = Balance::new(&seeds(4), &weights, EPSILON);
        let big = b.owner(7).unwrap();
        assert_ne!(b.owner(8), Some(big));
        assert!((0..1000u128).all(|h| h == 7 || b.owner(h + 100) != Some(big)));
    }

    #[test]
    fn tables_read_back_and_reports_merge() {
        let w = Weights {
            heavy: vec![(u128::MAX, 9), (1, 3)],
            rest: 40,
        };
        let text = table_text(1_700_000_000_000, &w);
        assert_eq!(parse_table(&text), Some((1_700_000_000_000, w)));
        assert_eq!(parse_table("1 2 abc 3"), None, "a key is 32 hex digits");
        assert_eq!(parse_table("1 2 00000000000000000000000000000001"), None);
        let a: &[(u128, u64)] = &[(1, 10), (2, 5)];
        let b: &[(u128, u64)] = &[(2, 6), (3, 4)];
        assert_eq!(
            merge([(20, a), (15, b)], 2),
            Weights {
                heavy: vec![(2, 11), (1, 10)],
                rest: 14,
            },
            "key 3's 4 and what neither node listed (4 + 5) are the rest"
        );
    }

    #[test]
    fn no_members_own_nothing_and_no_weights_is_plain_rendezvous() {
        assert_eq!(
            Balance::new(&[], &Weights::default(), EPSILON).owner(1),
            None
        );
        let s = seeds(3);
        let b = Balance::new(&s, &Weights::default(), EPSILON);
        for h in 0..100u128 {
            let best = (0..3).max_by_key(|i| (score(h, s[*i]), s[*i]));
            assert_eq!(b.owner(h), best);
        }
    }
}
