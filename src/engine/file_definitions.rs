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

use std::sync::{Arc, Mutex, PoisonError};

use crate::clock::Clock;
use crate::model::campaign::CampaignDef;
use crate::model::limit::PolicyDef;
use crate::store::{Op, Space};

use super::definitions::{campaign_tags, check_shareable_campaign, def_key, definition_op};
use super::hot::RecordKey;
use super::record::SubjectRecord;
use super::registry::{CampaignCounts, CampaignEntry, PolicyEntry, stack_tags};
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

impl<C: Clock> Engine<C> {
    /// Makes the file-defined definitions exactly `set` (see the module
    /// documentation). An error names the file and the field in it.
    pub fn replace_file_definitions(&self, set: FileDefinitions) -> Result<Replaced, EngineError> {
        // Validate every file before taking the lock.
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
            if self.shared().is_some() {
                check_shareable_campaign(&f.def, &compiled).map_err(|e| in_file(&f.source, e))?;
            }
            campaigns.push((f, compiled));
        }
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut reg = self.registry_to_change()?;
        let mut ops: Vec<Op> = Vec::new();
        let mut done = Replaced::default();

        // Policies whose file is gone.
        let gone: Vec<String> = reg
            .policies
            .values()
            .filter(|p| p.source.is_some() && !policies.iter().any(|(f, _)| f.name == p.name))
            .map(|p| p.name.clone())
            .collect();
        for name in &gone {
            reg.remove_policy(name);
            ops.push(Op::Delete(Space::Definitions, def_key(b"p/", name)));
            done.deleted += 1;
        }
        for (f, compiled) in policies {
            let id = match reg.policies.get(&f.name) {
                Some(p) if p.def == f.def && p.source.as_deref() == Some(f.source.as_str()) => {
                    done.unchanged += 1;
                    continue;
                }
                Some(p) => p.id,
                None => {
                    let id = self.new_definition_id(&reg)?;
                    reg.max_id = reg.max_id.max(id);
                    id
                }
            };
            ops.push(definition_op(b"p/", &f.name, id, &f.def, Some(&f.source)));
            done.written += 1;
            reg.insert_policy(PolicyEntry {
                id,
                name: f.name,
                tags: stack_tags(&f.def.limits),
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
                ops.push(Op::Delete(
                    Space::State,
                    RecordKey::Campaign(e.id).disk_key(),
                ));
                ops.push(Op::Delete(
                    Space::State,
                    super::timeline::timeline_key(e.id),
                ));
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
                let id = match reg.campaigns.get(&f.name) {
                    Some(c) if c.def == f.def && c.source.as_deref() == Some(f.source.as_str()) => {
                        done.unchanged += 1;
                        continue;
                    }
                    Some(c) => c.id,
                    None => self.new_definition_id(&reg)?,
                };
                ops.push(definition_op(b"c/", &f.name, id, &f.def, Some(&f.source)));
                done.written += 1;
                reg.insert_campaign(CampaignEntry {
                    id,
                    name: Arc::from(f.name.as_str()),
                    tags: campaign_tags(&compiled),
                    def: f.def,
                    counts: CampaignCounts::new(compiled.items.len()),
                    timeline: Arc::default(),
                    compiled,
                    record: Arc::new(Mutex::new(SubjectRecord::default())),
                    chain: Vec::new(),
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
        if !ops.is_empty() {
            self.write_durably(ops)?;
            self.publish(reg);
        }
        Ok(done)
    }
}
