//! The definitions a directory of files defines (docs/service.md,
//! "Definitions as files"), put in place whole: every file's definition is
//! validated, then the set is written in one durable batch and published at
//! once; or, on any error, nothing changes.
//!
//! Each definition keeps the file it came from (`source`), so the set a
//! directory defined before (even before a restart) is known: a definition
//! whose file is gone is deleted, and the API may not change one a file
//! defines ([`super::Conflict::DefinedByFile`]). Counters carry over as a PUT
//! carries them: an item whose definition is unchanged keeps its counts.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use crate::clock::Clock;
use crate::model::CompiledCampaign;
use crate::model::campaign::CampaignDef;
use crate::model::limit::{CompiledPolicy, PolicyDef};
use crate::store::{DefsWrite, Op, Space, StoreError};

use super::definitions::{DefKind, campaign_tags, def_key, definition_op};
use super::registry::{CampaignCounts, CampaignEntry, PolicyEntry, Registry};
use super::request::check_def_name;
use super::{Engine, EngineError, invalid};

/// One file's definition.
#[derive(Debug, Clone)]
pub struct FileDef<T> {
    /// The id: the file's name without its extension.
    pub name: String,
    /// The file, relative to the directory (`campaigns/spring.toml`).
    pub source: String,
    pub def: T,
}

/// Everything a definitions directory defines.
#[derive(Debug, Clone, Default)]
pub struct FileDefinitions {
    pub policies: Vec<FileDef<PolicyDef>>,
    pub campaigns: Vec<FileDef<CampaignDef>>,
}

/// What a [`Engine::replace_file_definitions`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replaced {
    /// Definitions written: new, changed, or taken over from the API.
    pub written: usize,
    /// Definitions whose file is gone, deleted.
    pub deleted: usize,
    /// Definitions as they were.
    pub unchanged: usize,
}

/// An error of one file: its path leads the field.
fn in_file(source: &str, e: EngineError) -> EngineError {
    match e {
        EngineError::InvalidArgument { field, message } => EngineError::InvalidArgument {
            field: if field.is_empty() {
                source.to_owned()
            } else {
                format!("{source}: {field}")
            },
            message,
        },
        other => other,
    }
}

/// Every file's definition with its compiled form.
type Validated = (
    Vec<(FileDef<PolicyDef>, CompiledPolicy)>,
    Vec<(FileDef<CampaignDef>, CompiledCampaign)>,
);

/// How long the definitions-writer lock lives unless renewed (its holder
/// renews it every second): a dead writer is replaced within this and a
/// renewal tick, ~6 s.
pub const WRITER_TTL_MS: u64 = 5_000;

/// How many times a directory's batch is computed again when another
/// change reached the shared store first.
const TRIES: usize = 5;

impl<C: Clock> Engine<C> {
    /// Makes the file-defined definitions exactly `set` (see the module
    /// documentation). An error names the file and the field in it.
    pub fn replace_file_definitions(&self, set: FileDefinitions) -> Result<Replaced, EngineError> {
        self.replace_file_definitions_as(set, None)
    }

    /// This node's name in the definitions-writer lock: its id and its
    /// process's nonce (a restarted node is a new writer).
    pub fn definitions_writer_name(&self) -> String {
        format!("{}/{:08x}", self.options.node_id, self.id_nonce)
    }

    /// Checks every file of `set` as [`Engine::replace_file_definitions`]
    /// would, changing nothing (a node that is not the definitions writer
    /// still refuses a bad directory, naming the file and field).
    pub fn validate_file_definitions(&self, set: FileDefinitions) -> Result<(), EngineError> {
        self.validated(set).map(drop)
    }

    /// [`Engine::replace_file_definitions`] by `writer`: with a shared
    /// store, the batch is applied all or nothing, only if no other change
    /// came since it was computed (else computed again, [`TRIES`] times at
    /// most) and only while `writer` (if given) holds the
    /// definitions-writer lock (docs/cluster.md, "Definitions as files").
    pub fn replace_file_definitions_as(
        &self,
        set: FileDefinitions,
        writer: Option<&str>,
    ) -> Result<Replaced, EngineError> {
        let (policies, campaigns) = self.validated(set)?;
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(shared) = self.shared() else {
            let (reg, ops, done) = self.plan(self.registry_to_change()?, policies, campaigns)?;
            if !ops.is_empty() {
                self.write_durably(ops)?;
                self.publish(reg);
            }
            return Ok(done);
        };
        for _ in 0..TRIES {
            // Read before the definitions: a change between the two makes
            // the write below a conflict, never a batch computed from a
            // newer read applied as if from an older one.
            let version = shared.definitions_version()?;
            let reg = self.registry_to_change()?;
            let (reg, ops, done) = self.plan(reg, policies.clone(), campaigns.clone())?;
            if ops.is_empty() {
                return Ok(done);
            }
            match shared.write_definitions(Some(version), writer, &ops)? {
                DefsWrite::Written(v) => {
                    self.publish(reg);
                    self.defs_version.store(v, Ordering::Release);
                    return Ok(done);
                }
                DefsWrite::Conflict(_) => continue,
                DefsWrite::NotWriter(holder) => {
                    return Err(StoreError::Unavailable(format!(
                        "not the definitions writer ({} is): nothing written",
                        holder.as_deref().unwrap_or("no node")
                    ))
                    .into());
                }
            }
        }
        Err(StoreError::Unavailable(format!(
            "the definitions changed under this batch {TRIES} times in a row: nothing written"
        ))
        .into())
    }

    /// Every file validated and compiled; an error names the file and the
    /// field.
    fn validated(&self, set: FileDefinitions) -> Result<Validated, EngineError> {
        let mut policies = Vec::with_capacity(set.policies.len());
        for f in set.policies {
            check_def_name("name", &f.name).map_err(|e| in_file(&f.source, e))?;
            let compiled = f.def.compile().map_err(|e| in_file(&f.source, e.into()))?;
            policies.push((f, compiled));
        }
        let mut campaigns = Vec::with_capacity(set.campaigns.len());
        for f in set.campaigns {
            check_def_name("id", &f.name).map_err(|e| in_file(&f.source, e))?;
            let compiled = f.def.compile().map_err(|e| in_file(&f.source, e.into()))?;
            self.check_placeable_campaign(&f.def, &compiled)
                .map_err(|e| in_file(&f.source, e))?;
            campaigns.push((f, compiled));
        }
        Ok((policies, campaigns))
    }

    /// The registry with `policies` and `campaigns` as the file-defined
    /// definitions of `reg`, the store ops that make it so, and what
    /// changed.
    fn plan(
        &self,
        mut reg: Registry,
        policies: Vec<(FileDef<PolicyDef>, CompiledPolicy)>,
        campaigns: Vec<(FileDef<CampaignDef>, CompiledCampaign)>,
    ) -> Result<(Registry, Vec<Op>, Replaced), EngineError> {
        let mut ops: Vec<Op> = Vec::new();
        let mut done = Replaced::default();

        // Policies whose file is gone.
        let gone: Vec<String> = reg
            .policies
            .values()
            .filter(|p| p.source.is_some() && !policies.iter().any(|(f, _)| f.name == p.name))
            .map(|p| p.name.clone())
            .collect();
        self.forget_deleted(&mut reg, &mut ops);
        for name in &gone {
            if let Some(p) = reg.remove_policy(name) {
                ops.push(Op::Delete(Space::Definitions, def_key(b"p/", name)));
                self.remember_deleted(&mut reg, DefKind::Policy, name, p.id, None, &mut ops);
                done.deleted += 1;
            }
        }
        for (f, compiled) in policies {
            let current = match reg.policies.get(&f.name) {
                Some(p) if p.def == f.def && p.source.as_deref() == Some(f.source.as_str()) => {
                    done.unchanged += 1;
                    continue;
                }
                p => p.map(|p| p.id),
            };
            let (id, _) =
                self.definition_id(&mut reg, DefKind::Policy, &f.name, current, false, &mut ops)?;
            ops.push(definition_op(b"p/", &f.name, id, &f.def, Some(&f.source)));
            done.written += 1;
            reg.insert_policy(PolicyEntry {
                id,
                name: f.name,
                tags: compiled.tags.clone(),
                def: f.def,
                stack: Arc::new(compiled.stack),
                source: Some(Arc::from(f.source.as_str())),
                counts: Arc::default(),
            });
        }

        // Campaigns whose file is gone; none may still be a parent.
        let gone: Vec<String> = reg
            .campaigns
            .values()
            .filter(|c| c.source.is_some() && !campaigns.iter().any(|(f, _)| *f.name == *c.name))
            .map(|c| c.name.to_string())
            .collect();
        for name in &gone {
            if let Some(e) = reg.remove_campaign(name) {
                ops.push(Op::Delete(Space::Definitions, def_key(b"c/", name)));
                let kept = Some((e.record.clone(), e.timeline.clone()));
                self.remember_deleted(&mut reg, DefKind::Campaign, name, e.id, kept, &mut ops);
                done.deleted += 1;
            }
        }
        // Parents first: a campaign goes in once its parent is in (or it
        // has none); what never can names a missing parent or a cycle.
        let mut pending = campaigns;
        while !pending.is_empty() {
            let before = pending.len();
            let mut rest = Vec::with_capacity(pending.len());
            for (f, compiled) in pending {
                let waits = f.def.parent.as_deref().is_some_and(|p| {
                    !reg.campaigns.contains_key(p)
                        || rest
                            .iter()
                            .any(|(o, _): &(FileDef<CampaignDef>, _)| o.name == p)
                });
                if waits {
                    rest.push((f, compiled));
                    continue;
                }
                reg.chain_from(&f.name, f.def.parent.as_deref())
                    .map_err(|m| in_file(&f.source, invalid("parent", m)))?;
                let current = match reg.campaigns.get(&f.name) {
                    Some(c) if c.def == f.def && c.source.as_deref() == Some(f.source.as_str()) => {
                        done.unchanged += 1;
                        continue;
                    }
                    c => c.cloned(),
                };
                let (id, back) = self.definition_id(
                    &mut reg,
                    DefKind::Campaign,
                    &f.name,
                    current.as_ref().map(|c| c.id),
                    false,
                    &mut ops,
                )?;
                let (record, timeline) = self
                    .carried_state(current.as_deref(), id, back)
                    .map_err(|e| in_file(&f.source, e))?;
                ops.push(definition_op(b"c/", &f.name, id, &f.def, Some(&f.source)));
                done.written += 1;
                reg.insert_campaign(CampaignEntry {
                    id,
                    name: Arc::from(f.name.as_str()),
                    tags: campaign_tags(&compiled),
                    def: f.def,
                    counts: CampaignCounts::new(compiled.items.len()),
                    timeline,
                    compiled,
                    record,
                    chain: Vec::new(),
                    ignored: Vec::new(),
                    source: Some(Arc::from(f.source.as_str())),
                });
            }
            if rest.len() == before {
                let (f, _) = &rest[0];
                let parent = f.def.parent.as_deref().unwrap_or_default();
                let why = if rest.iter().any(|(o, _)| o.name == parent) {
                    format!("campaign {parent:?} is in a parent cycle")
                } else {
                    format!("campaign {parent:?} does not exist")
                };
                return Err(in_file(&f.source, invalid("parent", why)));
            }
            pending = rest;
        }
        // A campaign left (defined through the API) whose parent's file is
        // gone.
        if let Some(orphan) = reg.campaigns.values().find(|c| {
            c.def
                .parent
                .as_deref()
                .is_some_and(|p| gone.iter().any(|g| g == p))
        }) {
            return Err(invalid(
                "definitions",
                format!(
                    "campaign {:?} has parent {:?}, whose file is gone; delete or reparent it first",
                    orphan.name,
                    orphan.def.parent.as_deref().unwrap_or_default()
                ),
            ));
        }
        // Every opt-out (`ignore_caps`) still names a cap of its chain: a
        // file's own, and those of campaigns under a file that changed.
        for c in reg.campaigns.values() {
            if let Err((field, why)) =
                reg.check_opt_outs(&c.compiled, c.chain.get(1..).unwrap_or_default())
            {
                let e = invalid(&field, format!("campaign {:?}: {why}", c.name));
                return Err(match &c.source {
                    Some(src) => in_file(src, e),
                    None => e,
                });
            }
        }
        Ok((reg, ops, done))
    }
}
