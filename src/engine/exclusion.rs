//! Exclusion within one screen (docs/semantics.md §6.4): at most one
//! eligible candidate per `exclusion_labels` label, the first in order, and
//! at most `max_per_screen` eligible candidates under a campaign. What one
//! screen has let through so far; no counter, no store: a screen decided
//! again (a compare-and-set retry on a cluster) starts it afresh.

use std::sync::Arc;

use super::registry::CampaignEntry;

/// The labels and per-campaign counts a screen's eligible candidates took.
/// Empty (no allocation) while no campaign of the screen has either rule.
#[derive(Default)]
pub(super) struct Exclusions<'a> {
    labels: Vec<&'a str>,
    /// (campaign id, eligible candidates under it), for campaigns with
    /// `max_per_screen`.
    counts: Vec<(u32, u32)>,
}

impl<'a> Exclusions<'a> {
    /// What excludes a candidate decided over `chain` (itself first), with
    /// the name `denied_by.cap` gives it: the first label of the chain an
    /// earlier eligible candidate took (`exclusion:<label>`, owned by the
    /// campaign that carries it), else the first campaign of the chain with
    /// `max_per_screen` eligible candidates already (`max_per_screen`).
    pub(super) fn excluded(
        &self,
        chain: &'a [Arc<CampaignEntry>],
    ) -> Option<(&'a CampaignEntry, String)> {
        if !self.labels.is_empty() {
            for e in chain {
                if let Some(l) = e
                    .def
                    .exclusion_labels
                    .iter()
                    .find(|l| self.labels.contains(&l.as_str()))
                {
                    return Some((e, format!("exclusion:{l}")));
                }
            }
        }
        chain.iter().find_map(|e| {
            let max = e.def.max_per_screen?;
            let n = self.count(e.id);
            (n >= max).then(|| (&**e, "max_per_screen".to_owned()))
        })
    }

    /// Notes an eligible candidate over `chain`: its labels are taken, and
    /// it counts under every campaign of the chain with `max_per_screen`.
    pub(super) fn take(&mut self, chain: &'a [Arc<CampaignEntry>]) {
        for e in chain {
            self.labels
                .extend(e.def.exclusion_labels.iter().map(String::as_str));
            if e.def.max_per_screen.is_some() {
                match self.counts.iter_mut().find(|(id, _)| *id == e.id) {
                    Some((_, n)) => *n += 1,
                    None => self.counts.push((e.id, 1)),
                }
            }
        }
    }

    fn count(&self, id: u32) -> u32 {
        self.counts
            .iter()
            .find(|(c, _)| *c == id)
            .map_or(0, |(_, n)| *n)
    }
}
