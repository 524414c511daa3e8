//! Definitions as files (docs/service.md, "Definitions as files"): a
//! directory of `policies/*.{json,toml}` and `campaigns/*.{json,toml}`, the
//! file name being the id, read whole ([`read`]) and put in place whole by
//! the engine ([`crate::engine::Engine::replace_file_definitions`]).
//!
//! [`watch`] reloads on SIGHUP and when the directory's content changes. It
//! reads the files' content every 2 s rather than asking the kernel for
//! events: a Kubernetes ConfigMap is swapped by renaming a symlinked
//! directory (`..data`), which file watches miss, and a few hundred small
//! files are read in well under a millisecond. A change is applied when two
//! reads agree (so 2–4 s after it), never half way through a copy.
//!
//! With a shared store (docs/cluster.md, "Definitions as files") one node
//! at a time writes its directory: the holder of the definitions-writer
//! lock, which it renews every [`RENEW`]. The others only check their own
//! directory at start and apply what is in the store (within a second, as
//! any change); when the writer dies another takes the lock within ~6 s
//! and applies its directory, whole. Every batch is applied all or nothing,
//! and only while its writer holds the lock.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::engine::{Engine, FileDef, FileDefinitions, Replaced};
use crate::front::metrics::DefinitionReloads;
use crate::model;

/// Largest definition file read.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// How often the directory is read for changes.
pub const POLL: Duration = Duration::from_secs(2);

/// How often, with a shared store, the definitions-writer lock is taken or
/// renewed (it lives [`crate::engine::WRITER_TTL_MS`]).
pub const RENEW: Duration = Duration::from_secs(1);

/// The files of `dir`'s `policies/` and `campaigns/` (hidden ones, such as
/// a ConfigMap's `..data`, left out), sorted, with their content.
///
/// An entry that is there but cannot be read as a regular file (a dangling
/// or looping symlink, a FIFO, a device, a directory named `*.json`) is an
/// error naming it, not a file left out: taken for a removed file, it would
/// delete its definition and that definition's counters on a passing fault
/// (an NFS hiccup, a half-applied ConfigMap, a mistyped link target).
fn files(dir: &Path) -> Result<Vec<(String, PathBuf, String)>, String> {
    let mut out = Vec::new();
    let mut any = false;
    for sub in ["policies", "campaigns"] {
        let d = dir.join(sub);
        // Absent means no such definitions; a dangling link to the
        // subdirectory is there, and read_dir below says why it fails.
        if std::fs::symlink_metadata(&d).is_err() {
            continue;
        }
        any = true;
        let entries = std::fs::read_dir(&d).map_err(|e| format!("{sub}: cannot read: {e}"))?;
        let mut names = Vec::new();
        for e in entries {
            let e = e.map_err(|e| format!("{sub}: cannot read: {e}"))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            let ext = path.extension().and_then(|x| x.to_str()).unwrap_or("");
            if name.starts_with('.') || !(ext == "json" || ext == "toml") {
                continue;
            }
            names.push((format!("{sub}/{name}"), path));
        }
        names.sort();
        for (rel, path) in names {
            let text = read_file(&rel, &path)?;
            out.push((rel, path, text));
        }
    }
    if !any {
        return Err(format!(
            "{}: neither policies/ nor campaigns/ is there",
            dir.display()
        ));
    }
    Ok(out)
}

/// One definition file's text, or why it cannot be read (`rel` names it).
fn read_file(rel: &str, path: &Path) -> Result<String, String> {
    use std::io::Read;
    let cannot = |e: std::io::Error| format!("{rel}: cannot read: {e}");
    let meta = std::fs::metadata(path).map_err(|e| {
        if std::fs::symlink_metadata(path).is_ok() {
            format!("{rel}: a symbolic link whose target cannot be read: {e}")
        } else {
            cannot(e)
        }
    })?;
    let not_regular = |m: &std::fs::Metadata| {
        let kind = if m.is_dir() {
            "a directory"
        } else {
            "not a regular file (a FIFO, socket or device)"
        };
        format!("{rel}: {kind}; a definition must be a regular file")
    };
    // Checked before opening: opening a FIFO waits for a writer, and opening
    // a device may do something.
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    // Should the entry be swapped for a FIFO after the check, opening it
    // does not wait for a writer (a regular file reads the same).
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = options.open(path).map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!(
            "{rel}: {} bytes; a definition file may have at most {MAX_FILE_BYTES}",
            meta.len()
        ));
    }
    // Bounded even if the file grows while it is read.
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(cannot)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{rel}: more than {MAX_FILE_BYTES} bytes; a definition file may have at most {MAX_FILE_BYTES}"
        ));
    }
    Ok(text)
}

/// A fingerprint of the directory's definition files (names and content).
pub fn fingerprint(dir: &Path) -> Option<u64> {
    let files = files(dir).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (rel, _, text) in &files {
        rel.hash(&mut h);
        text.hash(&mut h);
    }
    Some(h.finish())
}

/// Every definition of `dir`; an error names the file and the field.
pub fn read(dir: &Path) -> Result<FileDefinitions, String> {
    let mut set = FileDefinitions::default();
    for (rel, path, text) in files(dir)? {
        let toml = path.extension().is_some_and(|e| e == "toml");
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let taken = set.policies.iter().map(|f| (&f.source, &f.name));
        let taken = taken.chain(set.campaigns.iter().map(|f| (&f.source, &f.name)));
        let kind = rel.split('/').next().unwrap_or_default();
        if let Some((other, _)) = taken
            .into_iter()
            .find(|(s, n)| **n == name && s.starts_with(kind))
        {
            return Err(format!("{rel}: id {name:?} is also defined by {other}"));
        }
        if kind == "policies" {
            set.policies.push(parse(name, rel, &text, toml)?);
        } else {
            set.campaigns.push(parse(name, rel, &text, toml)?);
        }
    }
    Ok(set)
}

/// One file's definition (JSON, or TOML by its extension); an error names
/// the file and the field.
fn parse<T: serde::de::DeserializeOwned>(
    name: String,
    rel: String,
    text: &str,
    toml: bool,
) -> Result<FileDef<T>, String> {
    let def = if toml {
        model::from_toml(text)
    } else {
        model::from_json(text)
    }
    .map_err(|e| format!("{rel}: {e}"))?;
    Ok(FileDef {
        name,
        source: rel,
        def,
    })
}

/// Reads `dir` and puts its definitions in place, whole; or changes nothing
/// and says why.
pub fn load<C: Clock>(engine: &Engine<C>, dir: &Path) -> Result<Replaced, String> {
    load_as(engine, dir, None)
}

/// [`load`] as the definitions writer `writer` (a shared store).
pub fn load_as<C: Clock>(
    engine: &Engine<C>,
    dir: &Path,
    writer: Option<&str>,
) -> Result<Replaced, String> {
    let set = read(dir)?;
    engine
        .replace_file_definitions_as(set, writer)
        .map_err(|e| e.to_string())
}

/// What [`load_at_start`] did.
#[derive(Debug)]
pub enum Started {
    /// Applied the directory (one node, or the definitions writer).
    Applied(Replaced),
    /// A shared store whose definitions writer is another node: the
    /// directory was checked, and the store's definitions stay.
    Checked { writer: Option<String> },
}

/// At start: with a shared store, takes the definitions-writer lock if it
/// is free and applies `dir`, else only checks it; on one node, applies
/// it. A bad directory is an error naming the file and field either way.
pub fn load_at_start<C: Clock>(engine: &Engine<C>, dir: &Path) -> Result<Started, String> {
    // A lock call that fails (a slow shard) does not stop the start: the
    // node starts as a non-writer and [`watch`] tries again every second.
    let claimed = engine.claim_definitions_writer().unwrap_or_else(|e| {
        tracing::warn!("definitions-writer lock not taken at start, tried again in 1 s: {e}");
        Some((false, None))
    });
    match claimed {
        None => load(engine, dir).map(Started::Applied),
        Some((true, _)) => {
            let me = engine.definitions_writer_name();
            load_as(engine, dir, Some(&me)).map(Started::Applied)
        }
        Some((false, writer)) => {
            let set = read(dir)?;
            engine
                .validate_file_definitions(set)
                .map_err(|e| e.to_string())?;
            Ok(Started::Checked { writer })
        }
    }
}

/// Whether `dir` is a definitions directory (it has `policies/` or
/// `campaigns/`), for `freqcap validate`.
pub fn is_definitions_dir(dir: &Path) -> bool {
    dir.join("policies").is_dir() || dir.join("campaigns").is_dir()
}

/// Reloads `dir` on SIGHUP and whenever its content changes, until the
/// process ends (with a shared store, while this node is the definitions
/// writer; `writer_at_start`: whether it was at start). A bad directory
/// keeps the definitions in force; the log names the file and field, and
/// `errors` counts it.
///
/// SIGHUP is listened for from this call on, not from the future's first
/// poll, so a signal sent as soon as the service answers is not missed
/// (as `rls::RulesHandle::reload_on_sighup`).
pub fn watch<C: Clock + 'static>(
    engine: Arc<Engine<C>>,
    dir: PathBuf,
    counters: DefinitionReloads,
    last: Option<u64>,
    writer_at_start: bool,
) -> impl std::future::Future<Output = ()> + Send {
    #[cfg(unix)]
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    #[cfg(not(unix))]
    let hup: Option<()> = None;
    watch_with(engine, dir, counters, last, writer_at_start, hup)
}

#[cfg(unix)]
type Hup = tokio::signal::unix::Signal;
#[cfg(not(unix))]
type Hup = ();

async fn watch_with<C: Clock + 'static>(
    engine: Arc<Engine<C>>,
    dir: PathBuf,
    counters: DefinitionReloads,
    mut last: Option<u64>,
    writer_at_start: bool,
    #[allow(unused_mut, unused_variables)] mut hup: Option<Hup>,
) {
    // A fingerprint seen once, waiting for the next read to agree.
    let mut pending: Option<Option<u64>> = None;
    // With a shared store: whether this node is the definitions writer,
    // and its name in the lock.
    let mut writer = engine.shared().is_some().then_some(writer_at_start);
    let me = engine.definitions_writer_name();
    let mut tick = tokio::time::interval(if writer.is_some() { RENEW } else { POLL });
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let polls_per_read = (POLL.as_millis() / RENEW.as_millis()).max(1) as u64;
    for n in 0u64.. {
        #[cfg(unix)]
        let signalled = async {
            match hup.as_mut() {
                Some(h) => h.recv().await.is_some(),
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let signalled = std::future::pending::<bool>();
        let mut forced = tokio::select! {
            s = signalled => s,
            _ = tick.tick() => false,
        };
        if let Some(was) = writer {
            let e = engine.clone();
            let claimed = tokio::task::spawn_blocking(move || e.claim_definitions_writer()).await;
            let (now, holder) = match claimed {
                Ok(Ok(Some((mine, holder)))) => (mine, holder),
                Ok(Err(err)) => {
                    tracing::debug!("definitions-writer lock not renewed: {err}");
                    (false, None)
                }
                _ => (false, None),
            };
            if now && !was {
                // Another node's directory may be in force: apply this one
                // whatever its fingerprint.
                tracing::info!(dir = %dir.display(), "this node is now the definitions writer: applying {}", dir.display());
                forced = true;
            } else if was && !now {
                tracing::warn!(
                    dir = %dir.display(),
                    "this node is no longer the definitions writer ({} is): its directory is not applied",
                    holder.as_deref().unwrap_or("no node")
                );
            }
            writer = Some(now);
            // Not the writer: the sweeper applies what is in the store.
            if !now || (!forced && n % polls_per_read != 0) {
                continue;
            }
        }
        let d = dir.clone();
        let Ok(now) = tokio::task::spawn_blocking(move || fingerprint(&d)).await else {
            continue;
        };
        if !forced {
            if now == last {
                pending = None;
                continue;
            }
            // A change is applied once two reads 2 s apart agree: a copy
            // in progress (rsync, a checkout) is not taken for a directory
            // whose files are gone.
            if pending != Some(now) {
                pending = Some(now);
                continue;
            }
        }
        pending = None;
        let (e, d) = (engine.clone(), dir.clone());
        let as_writer = writer.map(|_| me.clone());
        let Ok(outcome) =
            tokio::task::spawn_blocking(move || load_as(&e, &d, as_writer.as_deref())).await
        else {
            continue;
        };
        match outcome {
            Ok(r) => {
                last = now;
                counters.applied.inc();
                tracing::info!(
                    written = r.written,
                    deleted = r.deleted,
                    unchanged = r.unchanged,
                    dir = %dir.display(),
                    "definitions reloaded: {} written, {} deleted, {} unchanged",
                    r.written,
                    r.deleted,
                    r.unchanged
                );
            }
            Err(why) => {
                // Not retried until the content changes again (or SIGHUP):
                // one log line per bad version, not one per poll.
                last = now;
                counters.errors.inc();
                tracing::error!(
                    dir = %dir.display(),
                    "definitions not reloaded, the previous ones stay: {why}"
                );
            }
        }
    }
}
