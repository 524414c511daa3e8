//! Priorities (docs/semantics.md §2.5): every decision carries a class, and an
//! item may cap how much of its limit each class may use, so that under
//! contention the lowest classes are refused first and critical traffic keeps
//! its headroom.
//!
//! A class with share `s` (given in millionths, [`Share`]) may hold up to
//! ⌈s × limit⌉ units of the item: the item is decided for that class as if its
//! limit were that ceiling ([`Item::for_share`]), over the same state, so the
//! shares of every class are checked in the same atomic step as the rest of the
//! stack and no class can ever be debited past the item's own limit. Pure
//! logic: the classes are compiled once per definition (`Classes`), and a
//! decision only picks the item of its class.

use super::Item;

/// A decision's class, highest first: `critical`, `high`, `default`, `low`,
/// `sheddable`. Ordered so that `a < b` means a is the higher class.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    Critical,
    High,
    #[default]
    Default,
    Low,
    Sheddable,
}

impl Priority {
    /// Every class, highest first.
    pub const ALL: [Priority; 5] = [
        Priority::Critical,
        Priority::High,
        Priority::Default,
        Priority::Low,
        Priority::Sheddable,
    ];

    /// The word the APIs use.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::High => "high",
            Priority::Default => "default",
            Priority::Low => "low",
            Priority::Sheddable => "sheddable",
        }
    }

    /// Reads the word the APIs use (exactly, lowercase).
    pub fn parse(s: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The error text for a word that is not a class: what would be accepted.
    pub fn expected(got: &str) -> String {
        // A word is short; a client's garbage is cut so the error stays so.
        let got: String = got.chars().take(32).collect();
        format!("must be one of critical, high, default, low, sheddable, got {got:?}")
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl<'de> serde::Deserialize<'de> for Priority {
    // By hand: a derived enum also reads `{"critical": null}`, which the
    // schema (a string) forbids. Only the word.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let word = String::deserialize(d)?;
        Priority::parse(&word).ok_or_else(|| serde::de::Error::custom(Priority::expected(&word)))
    }
}

/// A class's share of an item, in millionths of its limit: 1..=1 000 000.
/// Integers, so ⌈share × limit⌉ is exact for every limit up to 2^53 (in
/// doubles, 0.7 × 10 is 7.000000000000001, whose ceiling is 8).
pub type Share = u32;

/// The whole limit.
pub const WHOLE: Share = 1_000_000;

/// ⌈share × limit⌉ for a share in millionths: at least 1 for any share above
/// 0 and limit above 0, so a class with a share always gets a first unit.
pub fn scaled(limit: u64, share: Share) -> u64 {
    let v = (u128::from(limit) * u128::from(share)).div_ceil(u128::from(WHOLE));
    // ≤ limit, since share ≤ WHOLE.
    v as u64
}

/// The shares of one item, per class (each at most the share of the class
/// above it, so no class is ever refused where a lower one passes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares(pub [Share; 5]);

impl Default for Shares {
    fn default() -> Self {
        Shares([WHOLE; 5])
    }
}

impl Shares {
    pub fn of(&self, p: Priority) -> Share {
        self.0[p.index()]
    }

    /// Whether every class may use the whole item (nothing to compile).
    pub fn all_whole(&self) -> bool {
        self.0.iter().all(|&s| s == WHOLE)
    }
}

/// One item as each class sees it: `None` for a class that uses the item as
/// defined, else the item with its limit at that class's ceiling. Compiled
/// once per definition; a decision only indexes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Classes {
    items: [Option<Item>; 5],
    shares: Shares,
}

impl Classes {
    /// The classes of `item` under `shares`; `None` when every class uses
    /// the whole item (the common case costs a decision nothing).
    pub fn new(item: &Item, shares: Shares) -> Option<Classes> {
        if shares.all_whole() {
            return None;
        }
        let items = Priority::ALL.map(|p| {
            let s = shares.of(p);
            (s != WHOLE).then(|| item.for_share(s))
        });
        Some(Classes { items, shares })
    }

    /// The item `p` decides against: its own ceiling, or `base`.
    pub fn item<'a>(&'a self, base: &'a Item, p: Priority) -> &'a Item {
        self.items[p.index()].as_ref().unwrap_or(base)
    }

    pub fn shares(&self) -> Shares {
        self.shares
    }
}

/// The item `p` decides against, for an item that may have classes.
pub fn item_for<'a>(base: &'a Item, classes: Option<&'a Classes>, p: Priority) -> &'a Item {
    match classes {
        Some(c) => c.item(base, p),
        None => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_are_exact_and_give_a_first_unit() {
        assert_eq!(scaled(10, 700_000), 7);
        assert_eq!(scaled(10, 500_000), 5);
        assert_eq!(scaled(3, 200_000), 1);
        assert_eq!(scaled(1, 1), 1);
        assert_eq!(scaled(crate::MAX_EXACT, WHOLE), crate::MAX_EXACT);
        assert_eq!(
            scaled(crate::MAX_EXACT, 500_000),
            crate::MAX_EXACT.div_ceil(2)
        );
    }

    #[test]
    fn words_round_trip_and_order_highest_first() {
        for p in Priority::ALL {
            assert_eq!(Priority::parse(p.as_str()), Some(p));
        }
        assert_eq!(Priority::parse("Critical"), None);
        assert!(Priority::Critical < Priority::Sheddable);
        assert_eq!(Priority::default(), Priority::Default);
    }
}
