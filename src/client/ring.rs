//! Consistent hashing of users (or keys) over freqcap nodes: the affinity
//! that makes a cluster cheap (docs/cluster.md, "Affinity": a user served by
//! one node needs no read round trip and meets no conflict). Each node owns
//! [`POINTS`] points on a ring of 64-bit hashes; a key goes to the owner of
//! the first point at or after its hash, and, when that node is down, to the
//! next distinct node along the ring: only the dead node's keys move.

use siphasher::sip::SipHasher13;
use std::hash::Hasher;

/// Points per node: with 3 nodes, shares within a few percent of a third.
const POINTS: usize = 160;

/// A fixed key: every client process must place a key on the same node.
fn hash(bytes: &[u8]) -> u64 {
    let mut h = SipHasher13::new_with_keys(0x6672_6571_6361_7000, 0x7269_6e67_0000_0001);
    h.write(bytes);
    h.finish()
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct Ring {
    /// (point, node index), sorted by point.
    points: Vec<(u64, usize)>,
    nodes: usize,
}

impl Ring {
    /// A ring over `nodes` (their names place their points, so the order of
    /// the list does not matter).
    pub fn new(nodes: &[String]) -> Ring {
        let mut points = Vec::with_capacity(nodes.len() * POINTS);
        for (i, n) in nodes.iter().enumerate() {
            for p in 0..POINTS {
                points.push((hash(format!("{n}#{p}").as_bytes()), i));
            }
        }
        points.sort_unstable();
        Ring {
            points,
            nodes: nodes.len(),
        }
    }

    /// The nodes for `key`, in the order to try them: its owner first, then
    /// each other node once, along the ring.
    pub fn order(&self, key: &str) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.nodes);
        if self.points.is_empty() {
            return out;
        }
        let h = hash(key.as_bytes());
        let start = self.points.partition_point(|p| p.0 < h);
        for i in 0..self.points.len() {
            let node = self.points[(start + i) % self.points.len()].1;
            if !out.contains(&node) {
                out.push(node);
                if out.len() == self.nodes {
                    break;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn shares_are_even_and_order_covers_every_node() {
        let r = Ring::new(&names(&["a:1", "b:1", "c:1"]));
        let mut count = [0usize; 3];
        for u in 0..30_000 {
            let o = r.order(&format!("user-{u}"));
            assert_eq!(o.len(), 3);
            count[o[0]] += 1;
        }
        for c in count {
            assert!((8_000..12_000).contains(&c), "{count:?}");
        }
    }

    /// When a node dies its keys go to their next node; no other key moves.
    #[test]
    fn only_a_dead_nodes_keys_move() {
        let r = Ring::new(&names(&["a:1", "b:1", "c:1"]));
        for u in 0..10_000 {
            let o = r.order(&format!("user-{u}"));
            // With node 2 down, the first live node in the order.
            let live = o.iter().copied().find(|&n| n != 2).unwrap();
            if o[0] != 2 {
                assert_eq!(live, o[0], "a live node's key stays");
            }
        }
        // The same names in another order place keys the same way.
        let r2 = Ring::new(&names(&["c:1", "a:1", "b:1"]));
        let name = ["a:1", "b:1", "c:1"];
        let name2 = ["c:1", "a:1", "b:1"];
        for u in 0..1_000 {
            let k = format!("user-{u}");
            assert_eq!(name[r.order(&k)[0]], name2[r2.order(&k)[0]]);
        }
    }
}
