//! Policies and campaigns: put, get and delete, and loading them (with the
//! campaigns' counters) when the engine opens.

use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::clock::{Clock, Nanos};
use crate::model::campaign::CampaignDef;
use crate::model::limit::PolicyDef;
use crate::model::{CompiledCampaign, Scope, Warning};
use crate::store::{Op, Space, Store, StoreError, codec};

use super::hot::RecordKey;
use super::leases::leasable;
use super::minutes::Timeline;
use super::record::{SubjectRecord, legacy_tag};
use super::registry::{
    CampaignCounts, CampaignEntry, CampaignState, Deleted, PolicyEntry, Registry,
};
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
                tags: compiled.tags.clone(),
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
            let (record, timeline) = match keep.and_then(|r| r.campaign_by_id(d.id)) {
                Some(e) => (e.record.clone(), e.timeline.clone()),
                None => campaign_state(store, d.id)?,
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
                ignored: Vec::new(),
                source: d.source.map(Arc::from),
            };
            let e = Arc::new(entry);
            reg.campaigns_by_id.insert(e.id, e.clone());
            reg.campaigns.insert(name, e);
        } else if k.starts_with(b"dp/") || k.starts_with(b"dc/") {
            let d: StoredDeleted =
                serde_json::from_slice(payload).map_err(|e| corrupt(&k, e.to_string()))?;
            let name = String::from_utf8_lossy(&k[3..]).into_owned();
            reg.max_id = reg.max_id.max(d.id);
            let (map, kept) = if k.starts_with(b"dp/") {
                (&mut reg.deleted_policies, None)
            } else {
                let kept = keep
                    .and_then(|r| r.deleted_campaigns.get(&name))
                    .filter(|x| x.id == d.id)
                    .and_then(|x| x.kept.clone());
                (&mut reg.deleted_campaigns, kept)
            };
            map.insert(
                name,
                Deleted {
                    id: d.id,
                    at: d.at,
                    kept,
                },
            );
        }
    }
    reg.rechain();
    Ok(reg)
}

/// A campaign's campaign-scope record and minutes as the store has them
/// (empty if it has none). An unreadable copy of the minutes only blanks
/// the ad-ops page's history; an unreadable record is an error.
fn campaign_state(store: &dyn Store, id: u32) -> Result<CampaignState, StoreError> {
    let key = RecordKey::Campaign(id).disk_key();
    let record = match store.get(Space::State, &key)? {
        Some(v) => SubjectRecord::from_stored(&v).map_err(|m| corrupt(&key, m))?,
        None => SubjectRecord::default(),
    };
    let timeline = store
        .get(Space::State, &timeline_key(id))?
        .and_then(|v| Timeline::from_stored(&v).ok())
        .unwrap_or_default();
    Ok((Arc::new(Mutex::new(record)), Arc::new(Mutex::new(timeline))))
}

/// A deleted definition's id as stored (`dp/NAME`, `dc/NAME`).
#[derive(Serialize, Deserialize)]
struct StoredDeleted {
    id: u32,
    /// When it was deleted, in ns of the engine clock.
    at: Nanos,
}

/// Which kind of definition, for the ids and deletions they share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DefKind {
    Policy,
    Campaign,
}

impl DefKind {
    fn deleted_prefix(self) -> &'static [u8] {
        match self {
            DefKind::Policy => b"dp/",
            DefKind::Campaign => b"dc/",
        }
    }

    fn deleted(self, reg: &mut Registry) -> &mut super::registry::DeletedMap {
        match self {
            DefKind::Policy => &mut reg.deleted_policies,
            DefKind::Campaign => &mut reg.deleted_campaigns,
        }
    }
}

/// The store writes that remember `name` deleted at `at` under `id`.
pub(crate) fn deleted_op(kind: DefKind, name: &str, id: u32, at: Nanos) -> Op {
    let value = codec::frame(
        0,
        &serde_json::to_vec(&StoredDeleted { id, at }).unwrap_or_default(),
    );
    Op::Put(
        Space::Definitions,
        def_key(kind.deleted_prefix(), name),
        value,
    )
}

/// The store writes that drop what campaign `id`'s counters left behind
/// (its campaign-scope record and minutes), once no name can take the id
/// back.
fn campaign_state_drop(id: u32) -> [Op; 2] {
    [
        Op::Delete(Space::State, RecordKey::Campaign(id).disk_key()),
        Op::Delete(Space::State, timeline_key(id)),
    ]
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
    /// The id `name` is defined under, with the store writes that go with
    /// it (docs/semantics.md §5.3): its own id while it exists; the id of
    /// its deletion within the redefinition grace, so a delete and re-create
    /// is an edit; a new id when there is neither, or when `fresh` asks for
    /// a fresh start (`?reset=true`). A campaign's id left behind by a fresh
    /// start loses its campaign-scope record and minutes. The deletion of
    /// `name`, and those past the grace, are forgotten.
    pub(crate) fn definition_id(
        &self,
        reg: &mut Registry,
        kind: DefKind,
        name: &str,
        current: Option<u32>,
        fresh: bool,
        ops: &mut Vec<Op>,
    ) -> Result<(u32, Option<Deleted>), EngineError> {
        self.forget_deleted(reg, ops);
        let gone = kind.deleted(reg).remove(name);
        if gone.is_some() {
            ops.push(Op::Delete(
                Space::Definitions,
                def_key(kind.deleted_prefix(), name),
            ));
        }
        if !fresh {
            if let Some(id) = current {
                return Ok((id, None));
            }
            if let Some(d) = gone {
                return Ok((d.id, Some(d)));
            }
        } else if kind == DefKind::Campaign {
            for id in current.into_iter().chain(gone.map(|d| d.id)) {
                ops.extend(campaign_state_drop(id));
            }
        }
        let id = self.new_definition_id(reg)?;
        reg.max_id = reg.max_id.max(id);
        Ok((id, None))
    }

    /// Forgets deletions older than the redefinition grace: their ids are
    /// not taken back any more, and a campaign's counters go.
    pub(crate) fn forget_deleted(&self, reg: &mut Registry, ops: &mut Vec<Op>) {
        let now = self.now();
        let grace = self.options.redefine_grace;
        for kind in [DefKind::Policy, DefKind::Campaign] {
            let map = kind.deleted(reg);
            let old: Vec<(String, u32)> = map
                .iter()
                .filter(|(_, d)| now.saturating_sub(d.at) >= grace)
                .map(|(n, d)| (n.clone(), d.id))
                .collect();
            for (name, id) in old {
                map.remove(&name);
                ops.push(Op::Delete(
                    Space::Definitions,
                    def_key(kind.deleted_prefix(), &name),
                ));
                if kind == DefKind::Campaign {
                    ops.extend(campaign_state_drop(id));
                }
            }
        }
    }

    /// Remembers `name`, deleted now under `id`, for the redefinition
    /// grace (none: forgotten at once).
    pub(crate) fn remember_deleted(
        &self,
        reg: &mut Registry,
        kind: DefKind,
        name: &str,
        id: u32,
        kept: Option<CampaignState>,
        ops: &mut Vec<Op>,
    ) {
        if self.options.redefine_grace == 0 {
            if kind == DefKind::Campaign {
                ops.extend(campaign_state_drop(id));
            }
            return;
        }
        let at = self.now();
        ops.push(deleted_op(kind, name, id, at));
        kind.deleted(reg)
            .insert(name.to_owned(), Deleted { id, at, kept });
    }

    /// Stores a policy (replacing any of that name) and returns its warnings.
    /// Its items keep their counters by name (docs/semantics.md §5.3).
    pub fn put_policy(&self, name: &str, def: PolicyDef) -> Result<Vec<Warning>, EngineError> {
        self.put_policy_as(name, def, false)
    }

    /// [`Engine::put_policy`]; with `fresh`, every counter of the policy
    /// starts empty (`PUT ...?reset=true`).
    pub fn put_policy_as(
        &self,
        name: &str,
        def: PolicyDef,
        fresh: bool,
    ) -> Result<Vec<Warning>, EngineError> {
        check_def_name("name", name)?;
        let compiled = def.compile()?;
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut reg = self.registry_to_change()?;
        let current = match reg.policies.get(name) {
            Some(p) => {
                check_not_from_file("policy", name, p.source.as_ref())?;
                Some(p.id)
            }
            None => None,
        };
        let mut warnings = compiled.warnings.clone();
        if let Some(old) = reg.policies.get(name).filter(|_| !fresh) {
            let slots = |l: &[crate::model::LimitDef]| -> Vec<String> {
                l.iter()
                    .enumerate()
                    .map(|(i, d)| slot(d.name(), i))
                    .collect()
            };
            warnings.extend(restarted(
                slots(&old.def.limits)
                    .into_iter()
                    .zip(old.tags.iter().copied()),
                slots(&def.limits)
                    .into_iter()
                    .enumerate()
                    .map(|(i, s)| ((format!("limits[{i}]"), s), compiled.tags[i])),
            ));
        }
        let mut ops = Vec::new();
        let (id, _) =
            self.definition_id(&mut reg, DefKind::Policy, name, current, fresh, &mut ops)?;
        ops.push(definition_op(b"p/", name, id, &def, None));
        self.write_durably(ops)?;
        reg.insert_policy(PolicyEntry {
            id,
            name: name.to_owned(),
            tags: compiled.tags.clone(),
            def,
            stack: Arc::new(compiled.stack),
            source: None,
            counts: Arc::default(),
        });
        self.publish(reg);
        Ok(warnings)
    }

    pub fn get_policy(&self, name: &str) -> Option<PolicyDef> {
        self.registry().policies.get(name).map(|p| p.def.clone())
    }

    /// Deletes a policy. Its keys' counters stay for the redefinition
    /// grace: re-created under its name within it, it carries on
    /// (docs/semantics.md §5.3).
    pub fn delete_policy(&self, name: &str) -> Result<(), EngineError> {
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut reg = self.registry_to_change()?;
        if let Some(p) = reg.policies.get(name) {
            check_not_from_file("policy", name, p.source.as_ref())?;
        }
        let Some(p) = reg.remove_policy(name) else {
            return Err(EngineError::NotFound(format!("no policy named {name:?}")));
        };
        let mut ops = vec![Op::Delete(Space::Definitions, def_key(b"p/", name))];
        self.forget_deleted(&mut reg, &mut ops);
        self.remember_deleted(&mut reg, DefKind::Policy, name, p.id, None, &mut ops);
        self.write_durably(ops)?;
        self.publish(reg);
        Ok(())
    }

    /// Stores a campaign. Its parent must exist and must not make a cycle; a
    /// rejected put leaves the old definition. Its items keep their counters
    /// by name (docs/semantics.md §5.3); a new parent's caps apply from now
    /// on.
    pub fn put_campaign(&self, name: &str, def: CampaignDef) -> Result<Vec<Warning>, EngineError> {
        self.put_campaign_as(name, def, false)
    }

    /// [`Engine::put_campaign`]; with `fresh`, every counter of the
    /// campaign starts empty (`PUT ...?reset=true`).
    pub fn put_campaign_as(
        &self,
        name: &str,
        def: CampaignDef,
        fresh: bool,
    ) -> Result<Vec<Warning>, EngineError> {
        check_def_name("id", name)?;
        let compiled = def.compile()?;
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.check_placeable_campaign(&def, &compiled)?;
        let mut reg = self.registry_to_change()?;
        if let Some(c) = reg.campaigns.get(name) {
            check_not_from_file("campaign", name, c.source.as_ref())?;
        }
        let ancestors = reg
            .chain_from(name, def.parent.as_deref())
            .map_err(|m| invalid("parent", m))?;
        check_opt_outs(&reg, name, &compiled, &ancestors)?;
        let mut warnings = compiled.warnings.clone();
        let current = reg.campaigns.get(name).cloned();
        if let Some(old) = current.as_ref().filter(|_| !fresh) {
            let slots = |d: &CampaignDef, c: &CompiledCampaign| -> Vec<(String, u32)> {
                c.items
                    .iter()
                    .enumerate()
                    .map(|(i, x)| match d.caps.get(i) {
                        Some(cap) => (slot(cap.limit.name(), i), x.tag),
                        None => (x.name.clone(), x.tag),
                    })
                    .collect()
            };
            warnings.extend(restarted(
                slots(&old.def, &old.compiled).into_iter(),
                slots(&def, &compiled)
                    .into_iter()
                    .enumerate()
                    .map(|(i, (s, t))| ((item_field(&def, i), s), t)),
            ));
        }
        let mut ops = Vec::new();
        let (id, back) = self.definition_id(
            &mut reg,
            DefKind::Campaign,
            name,
            current.as_ref().map(|c| c.id),
            fresh,
            &mut ops,
        )?;
        let (record, timeline) = self.carried_state(current.as_deref(), id, back)?;
        ops.push(definition_op(b"c/", name, id, &def, None));
        self.write_durably(ops)?;
        reg.insert_campaign(CampaignEntry {
            id,
            name: Arc::from(name),
            tags: campaign_tags(&compiled),
            def,
            counts: CampaignCounts::new(compiled.items.len()),
            timeline,
            compiled,
            record,
            chain: Vec::new(),
            ignored: Vec::new(),
            source: None,
        });
        self.publish(reg);
        Ok(warnings)
    }

    pub fn get_campaign(&self, name: &str) -> Option<CampaignDef> {
        self.registry().campaigns.get(name).map(|c| c.def.clone())
    }

    /// Deletes a campaign without children (409 otherwise). Its counters
    /// stay for the redefinition grace: re-created under its name within
    /// it, it carries on (docs/semantics.md §5.3); after it they go.
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
        let mut ops = vec![Op::Delete(Space::Definitions, def_key(b"c/", name))];
        self.forget_deleted(&mut reg, &mut ops);
        let kept = Some((e.record.clone(), e.timeline.clone()));
        self.remember_deleted(&mut reg, DefKind::Campaign, name, e.id, kept, &mut ops);
        self.write_durably(ops)?;
        self.publish(reg);
        Ok(())
    }
}

impl<C: Clock> Engine<C> {
    /// The campaign-scope record and minutes campaign `id` carries on with:
    /// its own (`current`, of the same id), or those it had when deleted
    /// within the grace (`back`; read back from the store if this process
    /// let go of them), else empty ones.
    pub(crate) fn carried_state(
        &self,
        current: Option<&CampaignEntry>,
        id: u32,
        back: Option<Deleted>,
    ) -> Result<CampaignState, EngineError> {
        Ok(match (current, back) {
            (Some(c), _) if c.id == id => (c.record.clone(), c.timeline.clone()),
            (_, Some(Deleted { kept: Some(k), .. })) => k,
            (_, Some(_)) => campaign_state(&*self.store, id)?,
            _ => Default::default(),
        })
    }
}

/// Checks the opt-outs (`ignore_caps`) a definition of `name` as
/// `compiled` under `ancestors` makes, and those of its descendants it
/// would leave naming nothing (docs/semantics.md §6.9).
pub(crate) fn check_opt_outs(
    reg: &Registry,
    name: &str,
    compiled: &CompiledCampaign,
    ancestors: &[u32],
) -> Result<(), EngineError> {
    reg.check_opt_outs(compiled, ancestors)
        .map_err(|(field, m)| invalid(&field, m))?;
    match reg.opt_out_broken_by(name, compiled, ancestors) {
        Some((by, entry)) => Err(EngineError::Conflict(Conflict::OptedOut { by, entry })),
        None => Ok(()),
    }
}

/// Where an item stands for [`restarted`]: its name, or for an unnamed one
/// its position (whose generated name `<kind>-<i>` changes with its kind).
fn slot(name: Option<&str>, i: usize) -> String {
    match name {
        Some(n) => n.to_owned(),
        None => format!("#{i}"),
    }
}

/// Warnings for the items of a redefinition that stand where an item of the
/// replaced one stood (the same name, or unnamed at the same position) but
/// do not take its counter (a change of kind, or of a window's algorithm or
/// an approximate window's length, docs/semantics.md §5.3): they start
/// empty. `old`: (slot, tag) of the definition replaced; `new`: ((field,
/// slot), tag) of its replacement.
pub(crate) fn restarted(
    old: impl Iterator<Item = (String, u32)>,
    new: impl Iterator<Item = ((String, String), u32)>,
) -> Vec<Warning> {
    let old: Vec<(String, u32)> = old.collect();
    new.filter_map(|((field, slot), tag)| {
        old.iter()
            .find(|(s, t)| *s == slot && *t != tag)
            .map(|_| Warning {
                field,
                message: "its kind (or window algorithm, or approximate window length) changed: \
                          its counts start empty"
                    .to_owned(),
            })
    })
    .collect()
}

/// The field naming compiled item `i` of campaign `def` in a warning.
fn item_field(def: &CampaignDef, i: usize) -> String {
    match i.checked_sub(def.caps.len()) {
        None => format!("caps[{i}]"),
        Some(0) if def.budget.is_some() => "budget".to_owned(),
        Some(_) => "max_in_flight".to_owned(),
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
    c.items.iter().map(|x| x.tag).collect()
}

/// The tags a campaign's items' counters had before format 4: only the
/// migration of older records reads them.
pub(crate) fn legacy_campaign_tags(c: &CompiledCampaign) -> Vec<u32> {
    c.items
        .iter()
        .enumerate()
        .map(|(i, x)| legacy_tag(i, x.fingerprint))
        .collect()
}
