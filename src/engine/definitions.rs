//! Policies and campaigns: put, get and delete, and loading them (with the
//! campaigns' counters) when the engine opens.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::clock::Clock;
use crate::model::campaign::CampaignDef;
use crate::model::limit::PolicyDef;
use crate::model::{CompiledCampaign, Scope, Warning};
use crate::store::{Op, Space, Store, StoreError, codec};

use super::hot::RecordKey;
use super::leases::leasable;
use super::minutes::Timeline;
use super::record::{SubjectRecord, tag};
use super::registry::{CampaignCounts, CampaignEntry, PolicyEntry, Registry, stack_tags};
use super::request::check_def_name;
use super::timeline::timeline_key;
use super::{Conflict, Engine, EngineError, corrupt, invalid};

/// A definition as stored: its id and what the user wrote.
#[derive(Serialize, Deserialize)]
struct StoredDef<T> {
    id: u32,
    def: T,
    /// The definitions-directory file it comes from (docs/service.md,
    /// "Definitions as files"); absent: defined through the API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<String>,
}

/// The definitions in `store`, with every campaign's counters.
///
/// `keep`: definitions in memory whose campaign records (by id) carry over,
/// as a PUT keeps them; a shared store's definitions are read anew at every
/// change, and those records are this node's campaign-side state.
pub(crate) fn load_registry(
    store: &dyn Store,
    keep: Option<&Registry>,
) -> Result<Registry, StoreError> {
    let mut reg = Registry::default();
    for (k, v) in store.scan(Space::Definitions)? {
        let (_, payload) = codec::unframe(&v).map_err(|m| corrupt(&k, m))?;
        let name = String::from_utf8_lossy(&k[2..]).into_owned();
        if k.starts_with(b"p/") {
            let d: StoredDef<PolicyDef> =
                serde_json::from_slice(payload).map_err(|e| corrupt(&k, e.to_string()))?;
            let compiled = d.def.compile().map_err(|e| corrupt(&k, e.to_string()))?;
            reg.max_id = reg.max_id.max(d.id);
            reg.insert_policy(PolicyEntry {
                id: d.id,
                name,
                tags: stack_tags(&d.def.limits),
                def: d.def,
                stack: Arc::new(compiled.stack),
                source: d.source.map(Arc::from),
                // Counts carry over a re-read (a shared store re-reads every
                // definition on any change in the cluster).
                counts: keep
                    .and_then(|r| r.policy_by_id(d.id))
                    .map(|p| p.counts.clone())
                    .unwrap_or_default(),
            });
        } else if k.starts_with(b"c/") {
            let d: StoredDef<CampaignDef> =
                serde_json::from_slice(payload).map_err(|e| corrupt(&k, e.to_string()))?;
            let compiled = d.def.compile().map_err(|e| corrupt(&k, e.to_string()))?;
            let kept = keep
                .and_then(|r| r.campaign_by_id(d.id))
                .map(|e| e.record.clone());
            let record = match kept {
                Some(r) => r,
                None => Arc::new(Mutex::new(
                    match store.get(Space::State, &RecordKey::Campaign(d.id).disk_key())? {
                        Some(v) => SubjectRecord::from_stored(&v).map_err(|m| corrupt(&k, m))?,
                        None => SubjectRecord::default(),
                    },
                )),
            };
            // Its minutes (the ad-ops page); an unreadable copy only blanks
            // the page's history.
            let timeline = match keep.and_then(|r| r.campaign_by_id(d.id)) {
                Some(e) => e.timeline.clone(),
                None => Arc::new(Mutex::new(
                    store
                        .get(Space::State, &timeline_key(d.id))?
                        .and_then(|v| Timeline::from_stored(&v).ok())
                        .unwrap_or_default(),
                )),
            };
            reg.max_id = reg.max_id.max(d.id);
            let entry = CampaignEntry {
                id: d.id,
                tags: campaign_tags(&compiled),
                name: Arc::from(name.as_str()),
                def: d.def,
                counts: keep
                    .and_then(|r| r.campaign_by_id(d.id))
                    .filter(|e| e.counts.denied.len() == compiled.items.len())
                    .map(|e| e.counts.clone())
                    .unwrap_or_else(|| CampaignCounts::new(compiled.items.len())),
                timeline,
                compiled,
                record,
                chain: Vec::new(),
                source: d.source.map(Arc::from),
            };
            let e = Arc::new(entry);
            reg.campaigns_by_id.insert(e.id, e.clone());
            reg.campaigns.insert(name, e);
        }
    }
    reg.rechain();
    Ok(reg)
}

/// Refuses, with a shared store, a campaign whose campaign-scope state no
/// lease can share (docs/cluster.md, "Leases"): none today.
pub(crate) fn check_shareable_campaign(
    def: &CampaignDef,
    compiled: &CompiledCampaign,
) -> Result<(), EngineError> {
    // Campaign-scope state is leased (`super::leases`): windows, rates and
    // gaps (token lines), max_in_flight and budgets, adaptive ones by the
    // fleet's plan. Every item kind is leasable today; a new kind that is
    // not is refused here until it is.
    let mut caps = 0;
    for c in &compiled.items {
        let field = match c.item {
            crate::limits::Item::Budget(_) => "budget".to_owned(),
            crate::limits::Item::Concurrency(_) => "max_in_flight".to_owned(),
            _ => {
                caps += 1;
                format!("caps[{}]", caps - 1)
            }
        };
        if c.scope == Scope::Campaign && !leasable(&c.item) {
            return Err(invalid(
                field,
                "with a shared (redis-cluster) store, campaign-scope state must be leasable \
                 (docs/cluster.md, \"Leases\")",
            ));
        }
    }
    let _ = def;
    Ok(())
}

impl<C: Clock> Engine<C> {
    /// A copy of the definitions to change, taken under `defs_write`: with
    /// a shared store, read anew, so that a change another node made a
    /// moment ago is not undone.
    pub(crate) fn registry_to_change(&self) -> Result<Registry, EngineError> {
        if self.shared().is_some() {
            return Ok(load_registry(&*self.store, Some(&self.registry()))?);
        }
        Ok((*self.registry()).clone())
    }

    /// An id for a new definition: above every id in use, and with a shared
    /// store one no other node hands out.
    pub(crate) fn new_definition_id(&self, reg: &Registry) -> Result<u32, EngineError> {
        match self.shared() {
            Some(shared) => Ok(shared.new_id(reg.max_id)?),
            None => Ok(reg.max_id + 1),
        }
    }

    /// Whether the shared store answered lately (its definitions' version
    /// was read within the last 2 s by [`Engine::cluster_tick`]); always
    /// true on one node.
    pub fn shared_reachable(&self) -> bool {
        self.shared().is_none()
            || self
                .now()
                .saturating_sub(self.shared_ok_at.load(Ordering::Acquire))
                < 2_000_000_000
    }

    /// With a shared store, what the sweeper does every 250 ms: applies
    /// definitions other nodes changed, and renews this node's grants.
    pub fn cluster_tick(&self) -> Result<(), EngineError> {
        if self.shared().is_none() {
            return Ok(());
        }
        let r = self.refresh_definitions().map(drop);
        if r.is_ok() {
            self.shared_ok_at.fetch_max(self.now(), Ordering::AcqRel);
        }
        self.renew_leases();
        self.refresh_fleet_top();
        self.drop_unowned(self.now());
        r
    }

    /// With a shared store: applies the definitions other nodes changed, if
    /// any changed since the last call (the sweeper calls it every 250 ms,
    /// so a change reaches every node within a second). Returns whether it
    /// applied a change.
    pub fn refresh_definitions(&self) -> Result<bool, EngineError> {
        let Some(shared) = self.shared() else {
            return Ok(false);
        };
        let version = shared.definitions_version()?;
        if version == self.defs_version.load(Ordering::Acquire) {
            return Ok(false);
        }
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Read after the version: a change made between the two is applied
        // now and again at the next call, never missed.
        // A campaign's record (this node's campaign-side state: its holds
        // and spend under its grants) carries over, as a PUT keeps it.
        let reg = load_registry(&*self.store, Some(&self.registry()))?;
        self.publish(reg);
        self.defs_version.store(version, Ordering::Release);
        Ok(true)
    }

    /// Writes a definition under `prefix` + `name` with its id, durably.
    fn write_definition<T: serde::Serialize>(
        &self,
        prefix: &[u8],
        name: &str,
        id: u32,
        def: &T,
    ) -> Result<(), EngineError> {
        self.write_durably(vec![definition_op(prefix, name, id, def, None)])
    }

    /// Stores a policy (replacing any of that name) and returns its warnings.
    /// Counters of items whose definition is unchanged at the same index carry
    /// on; a changed item's counters start empty.
    pub fn put_policy(&self, name: &str, def: PolicyDef) -> Result<Vec<Warning>, EngineError> {
        check_def_name("name", name)?;
        let compiled = def.compile()?;
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut reg = self.registry_to_change()?;
        let id = match reg.policies.get(name) {
            Some(p) => {
                check_not_from_file("policy", name, p.source.as_ref())?;
                p.id
            }
            None => self.new_definition_id(&reg)?,
        };
        self.write_definition(b"p/", name, id, &def)?;
        reg.max_id = reg.max_id.max(id);
        reg.insert_policy(PolicyEntry {
            id,
            name: name.to_owned(),
            tags: stack_tags(&def.limits),
            def,
            stack: Arc::new(compiled.stack),
            source: None,
            counts: Arc::default(),
        });
        self.publish(reg);
        Ok(compiled.warnings)
    }

    pub fn get_policy(&self, name: &str) -> Option<PolicyDef> {
        self.registry().policies.get(name).map(|p| p.def.clone())
    }

    pub fn delete_policy(&self, name: &str) -> Result<(), EngineError> {
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut reg = self.registry_to_change()?;
        if let Some(p) = reg.policies.get(name) {
            check_not_from_file("policy", name, p.source.as_ref())?;
        }
        if reg.remove_policy(name).is_none() {
            return Err(EngineError::NotFound(format!("no policy named {name:?}")));
        }
        self.write_durably(vec![Op::Delete(Space::Definitions, def_key(b"p/", name))])?;
        self.publish(reg);
        Ok(())
    }

    /// Stores a campaign. Its parent must exist and must not make a cycle; a
    /// rejected put leaves the old definition. Counters follow the policy rule
    /// (unchanged items keep theirs); a new parent's caps apply from now on.
    pub fn put_campaign(&self, name: &str, def: CampaignDef) -> Result<Vec<Warning>, EngineError> {
        check_def_name("id", name)?;
        let compiled = def.compile()?;
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.shared().is_some() {
            check_shareable_campaign(&def, &compiled)?;
        }
        let mut reg = self.registry_to_change()?;
        if let Some(c) = reg.campaigns.get(name) {
            check_not_from_file("campaign", name, c.source.as_ref())?;
        }
        reg.chain_from(name, def.parent.as_deref())
            .map_err(|m| invalid("parent", m))?;
        let id = match reg.campaigns.get(name) {
            Some(c) => c.id,
            None => self.new_definition_id(&reg)?,
        };
        self.write_definition(b"c/", name, id, &def)?;
        let warnings = compiled.warnings.clone();
        reg.insert_campaign(CampaignEntry {
            id,
            name: Arc::from(name),
            tags: campaign_tags(&compiled),
            def,
            counts: CampaignCounts::new(compiled.items.len()),
            timeline: Arc::default(),
            compiled,
            record: Arc::new(Mutex::new(SubjectRecord::default())),
            chain: Vec::new(),
            source: None,
        });
        self.publish(reg);
        Ok(warnings)
    }

    pub fn get_campaign(&self, name: &str) -> Option<CampaignDef> {
        self.registry().campaigns.get(name).map(|c| c.def.clone())
    }

    /// Deletes a campaign without children (409 otherwise) and its counters.
    pub fn delete_campaign(&self, name: &str) -> Result<(), EngineError> {
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut reg = self.registry_to_change()?;
        let Some(c) = reg.campaigns.get(name) else {
            return Err(EngineError::NotFound(format!("no campaign named {name:?}")));
        };
        check_not_from_file("campaign", name, c.source.as_ref())?;
        if reg.has_children(name) {
            return Err(EngineError::Conflict(Conflict::HasChildren {
                name: name.to_owned(),
            }));
        }
        let Some(e) = reg.remove_campaign(name) else {
            return Err(EngineError::NotFound(format!("no campaign named {name:?}")));
        };
        self.write_durably(vec![
            Op::Delete(Space::Definitions, def_key(b"c/", name)),
            Op::Delete(Space::State, RecordKey::Campaign(e.id).disk_key()),
            Op::Delete(Space::State, timeline_key(e.id)),
        ])?;
        self.publish(reg);
        Ok(())
    }
}

/// The store write of a definition under `prefix` + `name`.
pub(crate) fn definition_op<T: serde::Serialize>(
    prefix: &[u8],
    name: &str,
    id: u32,
    def: &T,
    source: Option<&str>,
) -> Op {
    let stored = StoredDef {
        id,
        def,
        source: source.map(str::to_owned),
    };
    let value = codec::frame(0, &serde_json::to_vec(&stored).unwrap_or_default());
    Op::Put(Space::Definitions, def_key(prefix, name), value)
}

/// A change through the API of a definition a file defines: refused
/// (409), naming the file.
fn check_not_from_file(
    kind: &str,
    name: &str,
    source: Option<&Arc<str>>,
) -> Result<(), EngineError> {
    match source {
        Some(file) => Err(EngineError::Conflict(Conflict::DefinedByFile {
            what: format!("{kind} {name:?}"),
            file: file.to_string(),
        })),
        None => Ok(()),
    }
}

pub(crate) fn def_key(prefix: &[u8], name: &str) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}

pub(crate) fn campaign_tags(c: &CompiledCampaign) -> Vec<u32> {
    c.items
        .iter()
        .enumerate()
        .map(|(i, x)| tag(i, x.fingerprint))
        .collect()
}
