//! Definitions the engine decides by: named policies and campaigns with their
//! parent chains. Readers take an immutable snapshot (`Arc<Registry>`); a change
//! builds a new one, so a decision sees one consistent set of definitions.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use crate::limits::stack::Stack;
use crate::model::campaign::{CampaignDef, CompiledCampaign, fingerprint};
use crate::model::limit::PolicyDef;

use super::record::{SubjectRecord, legacy_tag};

/// The deepest parent chain accepted. Chains are walked on every decision.
pub const MAX_DEPTH: usize = 16;

/// A policy's decisions since it was defined, for the per-policy metrics
/// (docs/service.md, "Per-definition metrics"): three relaxed atomic adds
/// per check at most.
#[derive(Debug, Default)]
pub struct PolicyCounts {
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    pub would_deny: AtomicU64,
    /// The limit of the policy's first adaptive item in its last decision,
    /// plus one (0: none yet): the key's current limit when the policy has
    /// one key, as a service guarding one backend does (docs/adaptive.md).
    pub adaptive_limit: AtomicU64,
}

/// A campaign's screen results and commits since it was defined, for the
/// per-campaign metrics.
#[derive(Debug, Default)]
pub struct CampaignCounts {
    /// Candidates of it found eligible (without `would_deny`).
    pub eligible: AtomicU64,
    /// Candidates of it answered eligible in shadow mode only.
    pub would_deny: AtomicU64,
    /// Candidates denied by one of its items, by the item's index (caps,
    /// then budget, then max_in_flight); any candidate whose chain holds it
    /// counts here.
    pub denied: Box<[AtomicU64]>,
    /// Screens without a user it refused (`unknown_user: deny`).
    pub unknown_user: AtomicU64,
    /// Candidates of it (or of a descendant) screened outside its flight.
    pub out_of_flight: AtomicU64,
    /// Candidates of it (or of a descendant) screened off its schedule.
    pub off_schedule: AtomicU64,
    /// Commits won by a candidate of it.
    pub commits: AtomicU64,
    /// The last impressions-per-user figures of the timeline and when they
    /// were counted: counting walks the hot tier, so it is redone at most
    /// every 30 s however many pages are open.
    pub per_user: Mutex<Option<(crate::clock::Nanos, super::minutes::PerUser)>>,
}

impl CampaignCounts {
    pub fn new(items: usize) -> Arc<Self> {
        Arc::new(CampaignCounts {
            denied: (0..items).map(|_| AtomicU64::new(0)).collect(),
            ..CampaignCounts::default()
        })
    }
}

/// A named policy.
#[derive(Debug)]
pub struct PolicyEntry {
    /// Stable id: counters are keyed by it, so a deleted and re-created policy
    /// starts fresh.
    pub id: u32,
    pub name: String,
    pub def: PolicyDef,
    pub stack: Arc<Stack>,
    /// Counter tag of each item ([`crate::limits::counter_tag`]).
    pub tags: Vec<u32>,
    /// The file of the definitions directory it comes from
    /// (`policies/api.json`); `None`: defined through the API.
    pub source: Option<Arc<str>>,
    pub counts: Arc<PolicyCounts>,
}

/// A campaign.
#[derive(Debug)]
pub struct CampaignEntry {
    pub id: u32,
    /// Shared: every screen result names its campaign, and an `Arc` clone is
    /// a counter increment where a `String` clone is an allocation.
    pub name: Arc<str>,
    pub def: CampaignDef,
    pub compiled: CompiledCampaign,
    /// Counter tag of each compiled item.
    pub tags: Vec<u32>,
    /// Its campaign-scope counters. Shared by every child (through the chain)
    /// and kept across redefinitions (the `Arc` moves to the new entry). A std
    /// mutex, held for one decision; campaigns are few and always in memory, and
    /// each having its own lock (rather than a shard lock of the hot tier)
    /// lets a decision hold a whole chain in a fixed order without deadlock.
    pub record: Arc<Mutex<SubjectRecord>>,
    /// Ids from this campaign up to its root, itself first.
    pub chain: Vec<u32>,
    /// The items of its ancestors its candidates opt out of, as (campaign
    /// id, counter tag): its own `ignore_caps` and those of the campaigns
    /// between it and them (docs/semantics.md §6.9). Empty for nearly
    /// every campaign, so the check a decision makes per item is one
    /// `is_empty`.
    pub ignored: Vec<(u32, u32)>,
    /// As [`PolicyEntry::source`].
    pub source: Option<Arc<str>>,
    pub counts: Arc<CampaignCounts>,
    /// Its minutes (`super::timeline`), kept across redefinitions as
    /// `record` is.
    pub timeline: Arc<Mutex<super::minutes::Timeline>>,
}

/// A campaign and its ancestors, itself first: what one candidate is decided
/// over. Shared, so a reservation keeps the definitions it was made under for
/// one reference-count increment.
pub type Chain = Arc<[Arc<CampaignEntry>]>;

/// Maps keyed by names admins choose; foldhash is several times faster than
/// std's SipHash here and still seeded per process.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A campaign's campaign-scope record and its minutes, which carry over
/// its redefinitions.
pub type CampaignState = (
    Arc<Mutex<SubjectRecord>>,
    Arc<Mutex<super::minutes::Timeline>>,
);

/// A policy or campaign deleted less than the redefinition grace ago
/// ([`super::EngineOptions::redefine_grace`]): re-created under its name
/// within it, it takes this id back, so its counters carry on
/// (docs/semantics.md §5.3). Stored as `dp/NAME` or `dc/NAME` beside the
/// definitions.
#[derive(Debug, Clone)]
pub struct Deleted {
    pub id: u32,
    /// When it was deleted (engine clock).
    pub at: crate::clock::Nanos,
    /// A campaign's campaign-scope record and minutes as they were, while
    /// this process has them (after a restart they are read back from the
    /// store).
    pub kept: Option<CampaignState>,
}

/// Deleted definitions by name.
pub type DeletedMap = Map<String, Deleted>;

/// A snapshot of every definition.
#[derive(Debug, Default, Clone)]
pub struct Registry {
    /// Policies and campaigns deleted within the redefinition grace, by name.
    pub deleted_policies: DeletedMap,
    pub deleted_campaigns: DeletedMap,
    pub policies: Map<String, Arc<PolicyEntry>>,
    pub campaigns: Map<String, Arc<CampaignEntry>>,
    pub campaigns_by_id: Map<u32, Arc<CampaignEntry>>,
    /// Policies by id: writing a policy key's record looks up the item of
    /// each of its counters, on every decision.
    pub policies_by_id: Map<u32, Arc<PolicyEntry>>,
    /// Every campaign's chain, resolved once per snapshot.
    pub chains: Map<String, Chain>,
    /// Ids given so far: new definitions take the next one.
    pub max_id: u32,
    /// The tags counters of the definitions in force had before counters
    /// belonged to their items' names (`(def_id, legacy tag)` → tag), made
    /// at the first use after a change: a shared store's records written
    /// by an older build are read through it ([`Registry::retag_legacy`]).
    pub legacy: std::sync::OnceLock<Arc<Map<(u32, u32), u32>>>,
    /// Whether any campaign has `exclusion_labels` or `max_per_screen`:
    /// without, a screen skips them, and its candidates' chains are not
    /// walked twice more for rules no campaign has.
    pub screen_rules: bool,
}

/// The tags a stack's items' counters had before format 4
/// ([`super::record::legacy_tag`]): only the migration of older records
/// reads them.
pub fn legacy_stack_tags(stack_defs: &[crate::model::LimitDef]) -> Vec<u32> {
    stack_defs
        .iter()
        .enumerate()
        .map(|(i, d)| legacy_tag(i, fingerprint(d)))
        .collect()
}

impl Registry {
    pub fn campaign_by_id(&self, id: u32) -> Option<&Arc<CampaignEntry>> {
        self.campaigns_by_id.get(&id)
    }

    pub fn policy_by_id(&self, id: u32) -> Option<&Arc<PolicyEntry>> {
        self.policies_by_id.get(&id)
    }

    /// Adds or replaces a policy, under its name and its id.
    pub fn insert_policy(&mut self, entry: PolicyEntry) {
        self.legacy = Default::default();
        let e = Arc::new(entry);
        if let Some(old) = self.policies.insert(e.name.clone(), e.clone()) {
            self.policies_by_id.remove(&old.id);
        }
        self.policies_by_id.insert(e.id, e);
    }

    pub fn remove_policy(&mut self, name: &str) -> Option<Arc<PolicyEntry>> {
        self.legacy = Default::default();
        let e = self.policies.remove(name)?;
        self.policies_by_id.remove(&e.id);
        Some(e)
    }

    /// The chain of `parent` followed upwards, or why it cannot be used as the
    /// parent of `name`.
    pub fn chain_from(&self, name: &str, parent: Option<&str>) -> Result<Vec<u32>, String> {
        let mut chain = Vec::new();
        let mut cur = parent;
        while let Some(p) = cur {
            if p == name {
                return Err(format!(
                    "{name:?} would be its own ancestor (a parent cycle)"
                ));
            }
            let Some(e) = self.campaigns.get(p) else {
                return Err(format!("campaign {p:?} does not exist"));
            };
            chain.push(e.id);
            if chain.len() >= MAX_DEPTH {
                return Err(format!("a parent chain may be at most {MAX_DEPTH} deep"));
            }
            cur = e.def.parent.as_deref();
        }
        Ok(chain)
    }

    /// Adds or replaces a campaign (already compiled and checked), recomputing
    /// the chains of its descendants.
    /// An entry of the same name and id keeps its campaign-scope record and
    /// minutes; one under a new id (a fresh start) replaces the old id.
    pub fn insert_campaign(&mut self, mut entry: CampaignEntry) {
        if let Some(old) = self.campaigns.get(&*entry.name) {
            if old.id == entry.id {
                entry.record = old.record.clone();
                entry.timeline = old.timeline.clone();
            } else {
                self.campaigns_by_id.remove(&old.id);
            }
        }
        self.max_id = self.max_id.max(entry.id);
        let e = Arc::new(entry);
        self.campaigns_by_id.insert(e.id, e.clone());
        self.campaigns.insert(e.name.to_string(), e);
        self.rechain();
    }

    pub fn remove_campaign(&mut self, name: &str) -> Option<Arc<CampaignEntry>> {
        self.legacy = Default::default();
        let e = self.campaigns.remove(name)?;
        self.campaigns_by_id.remove(&e.id);
        self.chains.remove(name);
        self.note_screen_rules();
        Some(e)
    }

    /// Gives counters of `rec` written by an older build (tagged by index
    /// and definition fingerprint, [`super::record::legacy_tag`]) their
    /// item's tag, for the definitions in force; a counter of a definition
    /// since changed is left as it is, and so read as empty, as the older
    /// build read it. One hash lookup per counter that is not its item's
    /// already.
    pub fn retag_legacy(&self, rec: &mut SubjectRecord) {
        if rec.counters.is_empty() {
            return;
        }
        let map = self.legacy.get_or_init(|| {
            let mut m = Map::default();
            for p in self.policies.values() {
                for (old, new) in legacy_stack_tags(&p.def.limits).into_iter().zip(&p.tags) {
                    m.insert((p.id, old), *new);
                }
            }
            for c in self.campaigns.values() {
                let old = super::definitions::legacy_campaign_tags(&c.compiled);
                for (old, new) in old.into_iter().zip(&c.tags) {
                    m.insert((c.id, old), *new);
                }
            }
            Arc::new(m)
        });
        for c in rec.counters.iter_mut().filter(|c| c.def_id != 0) {
            if let Some(&new) = map.get(&(c.def_id, c.tag)) {
                c.tag = new;
            }
        }
    }

    /// The chain a candidate naming `name` is decided over.
    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.get(name)
    }

    /// The chain of the campaign of id `id`.
    pub fn chain_by_id(&self, id: u32) -> Option<&Chain> {
        self.chain(&self.campaign_by_id(id)?.name)
    }

    fn note_screen_rules(&mut self) {
        self.screen_rules = self
            .campaigns
            .values()
            .any(|e| !e.def.exclusion_labels.is_empty() || e.def.max_per_screen.is_some());
    }

    /// Recomputes every campaign's chain (definitions change rarely; campaigns
    /// number in the thousands).
    pub fn rechain(&mut self) {
        self.legacy = Default::default();
        self.note_screen_rules();
        let names: Vec<String> = self.campaigns.keys().cloned().collect();
        for name in names {
            let Some(e) = self.campaigns.get(&name) else {
                continue;
            };
            let mut chain = vec![e.id];
            let mut cur = e.def.parent.clone();
            while let Some(p) = cur {
                match self.campaigns.get(&p) {
                    Some(pe) if !chain.contains(&pe.id) && chain.len() < MAX_DEPTH => {
                        chain.push(pe.id);
                        cur = pe.def.parent.clone();
                    }
                    _ => break,
                }
            }
            let ignored = self.ignored_in(&chain);
            if chain != e.chain || ignored != e.ignored {
                let new = Arc::new(CampaignEntry {
                    id: e.id,
                    name: e.name.clone(),
                    def: e.def.clone(),
                    compiled: e.compiled.clone(),
                    tags: e.tags.clone(),
                    record: e.record.clone(),
                    chain,
                    ignored,
                    source: e.source.clone(),
                    counts: e.counts.clone(),
                    timeline: e.timeline.clone(),
                });
                self.campaigns_by_id.insert(new.id, new.clone());
                self.campaigns.insert(name, new);
            }
        }
        self.chains = self
            .campaigns
            .iter()
            .map(|(name, e)| {
                let chain: Chain = e
                    .chain
                    .iter()
                    .filter_map(|id| self.campaigns_by_id.get(id).cloned())
                    .collect();
                (name.clone(), chain)
            })
            .collect();
    }

    /// The items the candidates of chain `ids` (itself first) opt out of:
    /// each campaign's `ignore_caps` names items of the campaigns above it.
    /// An entry naming nothing there (refused when defined, see
    /// [`Registry::check_opt_outs`]) opts out of nothing.
    fn ignored_in(&self, ids: &[u32]) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        for (k, id) in ids.iter().enumerate() {
            let Some(e) = self.campaigns_by_id.get(id) else {
                continue;
            };
            for (ancestor, cap) in &e.compiled.ignore_caps {
                let Some(a) = self
                    .campaigns
                    .get(ancestor)
                    .filter(|a| ids[k + 1..].contains(&a.id))
                else {
                    continue;
                };
                if let Some(i) = a.compiled.items.iter().position(|c| c.name == *cap) {
                    out.push((a.id, a.tags[i]));
                }
            }
        }
        out
    }

    /// Checks the opt-outs of a campaign about to be defined as `compiled`,
    /// its ancestors being `ancestors` (from [`Registry::chain_from`]):
    /// each names one of them and one of its items. Returns the field and
    /// why.
    pub fn check_opt_outs(
        &self,
        compiled: &CompiledCampaign,
        ancestors: &[u32],
    ) -> Result<(), (String, String)> {
        for (i, (ancestor, cap)) in compiled.ignore_caps.iter().enumerate() {
            let field = format!("ignore_caps[{i}]");
            let Some(a) = self
                .campaigns
                .get(ancestor)
                .filter(|a| ancestors.contains(&a.id))
            else {
                return Err((
                    field,
                    format!("{ancestor:?} is not an ancestor of this campaign"),
                ));
            };
            if !a.compiled.items.iter().any(|c| c.name == *cap) {
                let names: Vec<&str> = a.compiled.items.iter().map(|c| c.name.as_str()).collect();
                return Err((
                    field,
                    format!("campaign {ancestor:?} has no cap named {cap:?} (it has {names:?})"),
                ));
            }
        }
        Ok(())
    }

    /// The first opt-out of a descendant of `name` that redefining `name`
    /// as `compiled` under the ancestors `ancestors` would leave naming
    /// nothing: (the descendant, its entry as written).
    pub fn opt_out_broken_by(
        &self,
        name: &str,
        compiled: &CompiledCampaign,
        ancestors: &[u32],
    ) -> Option<(String, String)> {
        let id = self.campaigns.get(name)?.id;
        for d in self.campaigns.values() {
            let Some(at) = d.chain.iter().skip(1).position(|&x| x == id) else {
                continue;
            };
            // Those between the descendant and `name` keep their items.
            let below = &d.chain[1..=at];
            for (ancestor, cap) in &d.compiled.ignore_caps {
                let ok = if ancestor == name {
                    compiled.items.iter().any(|c| c.name == *cap)
                } else {
                    self.campaigns
                        .get(ancestor)
                        .is_some_and(|a| below.contains(&a.id) || ancestors.contains(&a.id))
                };
                if !ok {
                    return Some((d.name.to_string(), format!("{ancestor}/{cap}")));
                }
            }
        }
        None
    }

    /// Whether any campaign names `name` as its parent.
    pub fn has_children(&self, name: &str) -> bool {
        self.campaigns
            .values()
            .any(|c| c.def.parent.as_deref() == Some(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(id: u32, name: &str) -> PolicyEntry {
        let def: PolicyDef =
            crate::model::from_json(r#"{"limits": [{"kind": "rate", "rate": 1, "per": "1s"}]}"#)
                .expect("valid policy");
        let compiled = def.compile().expect("compiles");
        PolicyEntry {
            id,
            name: name.to_owned(),
            tags: compiled.tags.clone(),
            def,
            stack: Arc::new(compiled.stack),
            source: None,
            counts: Arc::default(),
        }
    }

    #[test]
    fn policies_are_found_by_name_and_by_id_alike() {
        let mut r = Registry::default();
        r.insert_policy(policy(1, "a"));
        r.insert_policy(policy(2, "b"));
        // Redefined under a new id (deleted and made again): the old id is gone.
        r.insert_policy(policy(3, "a"));
        assert!(r.policy_by_id(1).is_none());
        assert_eq!(r.policy_by_id(3).map(|p| p.name.as_str()), Some("a"));
        assert_eq!(r.policies["a"].id, 3);
        assert!(r.remove_policy("b").is_some());
        assert!(r.policy_by_id(2).is_none());
        assert_eq!(r.policies.len(), r.policies_by_id.len());
    }

    /// A record an older build wrote reads with its counters of the
    /// definitions in force retagged; one of an older definition, and
    /// inline limits' (def_id 0), keep their tags.
    #[test]
    fn legacy_tags_of_the_definitions_in_force_are_retagged() {
        use crate::engine::record::{Counter, legacy_tag};
        use crate::limits::ItemState;
        let mut reg = Registry::default();
        let p = policy(3, "p");
        let new = p.tags[0];
        let old = legacy_stack_tags(&p.def.limits)[0];
        assert_eq!(
            old,
            legacy_tag(0, crate::model::campaign::fingerprint(&p.def.limits[0]))
        );
        reg.insert_policy(p);
        let counter = |def_id, tag| Counter {
            def_id,
            tag,
            state: ItemState::Fresh,
        };
        let mut rec = SubjectRecord {
            counters: vec![counter(3, old), counter(3, old ^ 0x100), counter(0, old)]
                .into_boxed_slice(),
            ..SubjectRecord::default()
        };
        reg.retag_legacy(&mut rec);
        let tags: Vec<(u32, u32)> = rec.counters.iter().map(|c| (c.def_id, c.tag)).collect();
        assert_eq!(tags, vec![(3, new), (3, old ^ 0x100), (0, old)]);
        // A change drops the map made for the definitions before it.
        reg.remove_policy("p");
        let mut again = SubjectRecord {
            counters: vec![counter(3, old)].into_boxed_slice(),
            ..SubjectRecord::default()
        };
        reg.retag_legacy(&mut again);
        assert_eq!(again.counters[0].tag, old);
    }
}
