//! The one label of a decision in `freqcap_decisions_total{outcome}`,
//! whatever front it came in by (docs/service.md, "Metrics"). Each front
//! once chose its own words: RESP counted a shadow would-deny as `allowed`
//! (against docs/semantics.md §6.6, which counts it `would_deny`), and gRPC
//! `Check` never said `delayed`. Every front now asks these functions.

use crate::engine::{CandidateResult, CheckOutcome};
use crate::limits::stack::Decision;

/// A check's outcome (a `/v1/check`, gRPC `Check`, RESP `FC.CHECK` or
/// `CL.THROTTLE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    Allowed,
    /// Allowed after a wait (a `delay` rule): the caller was told to wait.
    Delayed,
    Denied,
    /// Shadow mode (docs/semantics.md §6.6): answered allowed, but an
    /// enforced limit would have denied it.
    WouldDeny,
}

impl Checked {
    /// Every outcome, for a front that keeps a handle on each series.
    pub const ALL: [Checked; 4] = [
        Checked::Allowed,
        Checked::Delayed,
        Checked::Denied,
        Checked::WouldDeny,
    ];

    /// A decision's outcome; `would_deny` wins, as the answer says it.
    pub fn of(d: &Decision, would_deny: bool) -> Checked {
        if would_deny {
            Checked::WouldDeny
        } else if !d.allowed {
            Checked::Denied
        } else if d.delay > 0 {
            Checked::Delayed
        } else {
            Checked::Allowed
        }
    }

    /// A check's outcome.
    pub fn of_check(out: &CheckOutcome) -> Checked {
        Checked::of(&out.decision, out.would_deny)
    }

    /// A `CL.THROTTLE`'s outcome: limited or not, or a shadow would-deny
    /// (redis-cell has no delays).
    pub fn of_throttle(limited: bool, would_deny: bool) -> Checked {
        match (would_deny, limited) {
            (true, _) => Checked::WouldDeny,
            (false, true) => Checked::Denied,
            (false, false) => Checked::Allowed,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Checked::Allowed => "allowed",
            Checked::Delayed => "delayed",
            Checked::Denied => "denied",
            Checked::WouldDeny => "would_deny",
        }
    }

    /// The index of the outcome in [`Checked::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A screen's candidates by outcome: `eligible`, `ineligible` and, in
/// shadow mode, `would_deny` (an eligible candidate an enforced cap would
/// have made ineligible; counted there, not as eligible).
pub fn screened(results: &[CandidateResult]) -> [(&'static str, u64); 3] {
    let eligible = results.iter().filter(|r| r.eligible).count() as u64;
    let shadowed = results.iter().filter(|r| r.would_deny.is_some()).count() as u64;
    [
        ("eligible", eligible.saturating_sub(shadowed)),
        ("ineligible", results.len() as u64 - eligible),
        ("would_deny", shadowed),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(allowed: bool, delay: u64) -> Decision {
        Decision {
            allowed,
            delay,
            retry_after: None,
            remaining: 0,
            reset_after: 0,
            items: Default::default(),
        }
    }

    /// The table every front counts by.
    #[test]
    fn a_checks_outcome() {
        assert_eq!(Checked::of(&decision(true, 0), false), Checked::Allowed);
        assert_eq!(Checked::of(&decision(true, 5), false), Checked::Delayed);
        assert_eq!(Checked::of(&decision(false, 0), false), Checked::Denied);
        // A shadow would-deny is answered allowed but counted apart.
        assert_eq!(Checked::of(&decision(true, 0), true), Checked::WouldDeny);
        assert_eq!(Checked::of_throttle(false, true), Checked::WouldDeny);
        assert_eq!(Checked::of_throttle(true, false), Checked::Denied);
        assert_eq!(Checked::of_throttle(false, false), Checked::Allowed);
        for (i, c) in Checked::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
    }
}
