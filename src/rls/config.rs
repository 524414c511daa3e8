//! Envoy rate limit rules: envoyproxy/ratelimit's YAML files (one `domain`
//! each, nested `descriptors`), read from a directory and validated whole
//! into [`Rules`] (docs/rls.md, "Rules"). Errors name the file and the path
//! inside it: `api.yaml: descriptors[0].rate_limit.unit: ...`.
//!
//! Pure: [`Rules::parse`] takes file names and texts; [`Rules::load_dir`]
//! only reads them.
//!
//! The flow: [`Rules::load_dir`] reads the files (each at most
//! [`MAX_FILE_BYTES`]); [`Rules::parse`] bounds each text's nesting, parses
//! it, and builds a [`Node`] tree per domain with each rule's limit items
//! compiled once, for [`super::matching`] to walk per call. One mistake
//! refuses the directory whole, so a reload never applies half a change.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::engine::request::CompiledInline;
use crate::limits::Item;
use crate::model::LimitDef;

/// Largest rules file read (a typo pointing the directory at a log file
/// should not fill memory).
const MAX_FILE_BYTES: u64 = 4 << 20;

/// Deepest nesting of descriptors (Envoy sends a handful of entries).
const MAX_DEPTH: usize = 16;

/// A unit of a plain `rate_limit` and its window: a fixed window of this
/// length, counted from the Unix epoch, as envoyproxy/ratelimit counts it
/// (`UnitToDivider`: a month is 30 days, a year 365).
/// A `day` starts at midnight UTC; for windows in a time zone a rule takes
/// `limits` with `align: calendar` (docs/semantics.md §2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// The shortest; a finer limit takes `limits` items.
    Second,
    /// From the top of each UTC minute.
    Minute,
    /// From the top of each UTC hour.
    Hour,
    /// From midnight UTC.
    Day,
    /// From the epoch, so weeks start on Thursday, not Monday. Envoy's
    /// `limit` override cannot name it (its `RateLimitUnit` has no week).
    Week,
    /// 30 days, not a calendar month: its windows drift from the 1st.
    Month,
    /// 365 days: its windows drift from 1 January by a day per leap year.
    Year,
}

impl Unit {
    /// Every unit, shortest first, for [`Unit::parse`] and [`Unit::of_nanos`].
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The word a rules file writes (`unit: day`), lower case.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The window in seconds, as `UnitToDivider` has it: a rule moved from
    /// envoyproxy/ratelimit counts the same windows here.
    pub fn secs(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The unit whose window is exactly `ns` long; `None` (say 90 s) is
    /// reported as Envoy's `UNKNOWN` unit, the only way its field has.
    pub fn of_nanos(ns: u64) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.secs() * 1_000_000_000 == ns)
    }

    /// A unit named in any case (`Day`, `DAY`), as envoyproxy/ratelimit,
    /// which upper-cases the word, accepts it.
    fn parse(s: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(s))
    }
}

/// What a matched rule does.
#[derive(Debug, Clone)]
pub enum Action {
    /// Counted against these limit items (a plain `rate_limit` is one fixed
    /// window of its unit).
    Limit {
        /// Compiled once at load, so a call compiles nothing; an unchanged
        /// rule compiles alike at a reload and keeps its counters.
        limits: Arc<CompiledInline>,
        /// `rate_limit`'s figures, for `current_limit`; `None` for `limits`.
        plain: Option<(u32, Unit)>,
    },
    /// `requests_per_unit: 0`: every request is over (envoyproxy/ratelimit
    /// allows it, and it is how a key is blocked). Never sent to the engine;
    /// the unit gives `duration_until_reset` and `RateLimit-Policy`'s `w`.
    Block(Unit),
    /// `unlimited: true`: never counted.
    Unlimited,
}

/// One rule: a descriptor of a config with a `rate_limit` or `limits`.
#[derive(Debug, Clone)]
pub struct Rule {
    /// `rate_limit.name`, else the rule's path of keys (`remote_address`,
    /// `path_/api.remote_address`): the name in `RateLimit` headers.
    pub name: String,
    /// `rate_limit.name` as written (what `replaces` refers to).
    pub given_name: Option<String>,
    /// `rate_limit.replaces`: `given_name`s of rules this one switches off
    /// when both match one request (so applied per call, not at load).
    pub replaces: Vec<String>,
    /// `shadow_mode`: decided and debited as enforced, never over
    /// (docs/rls.md, "Shadow mode"): [`crate::engine::KeyCheck::enforced`].
    pub shadow: bool,
    /// What the rule does to a descriptor it matches.
    pub action: Action,
}

/// A level of a domain's descriptor tree.
#[derive(Debug, Default)]
pub struct Node {
    /// Children by `key` (any value) or `key_value`, as envoyproxy/ratelimit
    /// keys them.
    pub children: HashMap<String, Node>,
    /// Children whose `key_value` has a `*`: the pattern split at each `*`,
    /// and the child's key in `children`; tried in file order.
    pub wildcards: Vec<(Vec<String>, String)>,
    /// This level's rule; `None` for a descriptor that only nests. An `Arc`:
    /// a call takes a pointer, not a copy, and keeps it past a reload.
    pub rule: Option<Arc<Rule>>,
}

/// Every domain's rules, as loaded.
#[derive(Debug, Default)]
pub struct Rules {
    /// Each domain's tree, by the request's `domain`. One file per domain,
    /// so no rule depends on the order the files were read in.
    pub domains: HashMap<String, Node>,
    /// Rules in all domains (for the log line and metrics).
    pub count: usize,
}

/// An error in a rules file: which file, where in it, what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {}", if .path.is_empty() { .message.clone() } else { format!("{}: {}", .path, .message) })]
pub struct ConfigError {
    /// The file's name, or the directory's path if it cannot be read.
    pub file: String,
    /// Where in the file (`descriptors[0].rate_limit.unit`), as the JSON
    /// API names fields; empty for the file as a whole (not YAML, too big).
    pub path: String,
    /// What is wrong, and what is expected (the units, the allowed keys).
    pub message: String,
}

/// A parse step's result: on error, the path in the file where it is
/// (`descriptors[0].rate_limit.unit`) and what is wrong, joined with the
/// file's name into a [`ConfigError`] by the caller, so every message names
/// file, path and problem as the JSON API names its fields.
type Result<T> = std::result::Result<T, (String, String)>;

/// An error at `path`.
fn at(path: &str, message: impl Into<String>) -> (String, String) {
    (path.to_owned(), message.into())
}

impl Rules {
    /// Reads every `*.yaml`/`*.yml` file of `dir` (sorted by name, as
    /// envoyproxy/ratelimit's runtime directory is) and validates them whole.
    pub fn load_dir(dir: &Path) -> std::result::Result<Rules, ConfigError> {
        let dir_err = |m: String| ConfigError {
            file: dir.display().to_string(),
            path: String::new(),
            message: m,
        };
        let entries = std::fs::read_dir(dir).map_err(|e| dir_err(format!("cannot read: {e}")))?;
        let mut files = Vec::new();
        for e in entries {
            let e = e.map_err(|e| dir_err(format!("cannot read: {e}")))?;
            let path = e.path();
            let yaml = path
                .extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| x == "yaml" || x == "yml");
            // A directory or a socket named `x.yaml` is not a rules file.
            if yaml && path.is_file() {
                files.push(path);
            }
        }
        // Name order: the same first error on every host.
        files.sort();
        let mut texts = Vec::with_capacity(files.len());
        for path in files {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let file_err = |m: String| ConfigError {
                file: name.clone(),
                path: String::new(),
                message: m,
            };
            // Asked before reading: a file over the bound is never read.
            let len = std::fs::metadata(&path)
                .map_err(|e| file_err(format!("cannot read: {e}")))?
                .len();
            if len > MAX_FILE_BYTES {
                return Err(file_err(format!(
                    "{len} bytes; a rules file may have at most {MAX_FILE_BYTES}"
                )));
            }
            let text = std::fs::read_to_string(&path)
                .map_err(|e| file_err(format!("cannot read: {e}")))?;
            texts.push((name, text));
        }
        Rules::parse(&texts)
    }

    /// Validates rules files given as (file name, text).
    pub fn parse(files: &[(String, String)]) -> std::result::Result<Rules, ConfigError> {
        let mut rules = Rules::default();
        for (file, text) in files {
            let err = |(path, message): (String, String)| ConfigError {
                file: file.clone(),
                path,
                message,
            };
            // Before the parser, quadratic in depth ([`check_nesting`]).
            check_nesting(text)
                .map_err(|(line, message)| err(at("", format!("line {line}: {message}"))))?;
            // As JSON, so `limits` go through the API's model and field names.
            let doc: Value = serde_yaml_ng::from_str(text)
                .map_err(|e| err(at("", format!("not valid YAML: {e}"))))?;
            let (domain, node, count) = parse_file(&doc).map_err(err)?;
            if rules.domains.contains_key(&domain) {
                return Err(err(at(
                    "domain",
                    format!("domain {domain:?} is already defined by another file"),
                )));
            }
            rules.domains.insert(domain, node);
            rules.count += count;
        }
        Ok(rules)
    }
}

/// Deepest nesting of collections a rules file may have, flow (`[`, `{`)
/// and block (indentation, `- - x`) together. Descriptors nested
/// [`MAX_DEPTH`] deep take about two levels each, in either style.
const MAX_NESTING: usize = 64;

/// Refuses a text whose collections nest deeper than [`MAX_NESTING`], with
/// the line (from 1) where they do. libyaml's scanner takes quadratic time
/// on deep flow nesting (80 000 `[` took 13 s, before serde's recursion
/// limit refused the file), so it is measured first, in one pass.
///
/// A scan, not a parser: brackets inside quoted scalars, comments and words
/// (`a[b`) are not counted, nor the lines of block scalars (`|`, `>`). It may
/// overcount a plain scalar with a bracket after a space (`a [b`); it takes
/// 64 such brackets to refuse a file wrongly.
fn check_nesting(text: &str) -> std::result::Result<(), (usize, String)> {
    let too_deep = |line: usize| {
        Err((
            line,
            format!(
                "collections nest more than {MAX_NESTING} deep (descriptors nest at most {MAX_DEPTH})"
            ),
        ))
    };
    // Block indentation columns open, innermost last.
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    // A quoted scalar may go on over lines.
    let mut quote: Option<u8> = None;
    // The column of the node holding a block scalar, while its lines last.
    let mut block_scalar: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let n = n + 1;
        let b = line.as_bytes();
        let indent = b.iter().take_while(|&&c| c == b' ').count();
        let blank = b[indent..].iter().all(|c| c.is_ascii_whitespace());
        if let Some(header) = block_scalar {
            if blank || indent > header {
                continue;
            }
            block_scalar = None;
        }
        let mut i = 0;
        // Where the line's innermost block node starts (past any `- `).
        let mut node_col = indent;
        if quote.is_none() && flow == 0 {
            if blank || b[indent] == b'#' {
                continue;
            }
            // The line's block level, then one more for each `- ` opening
            // a sequence inside the one before on the same line.
            let mut col = indent;
            loop {
                while indents.last().is_some_and(|&top| top > col) {
                    indents.pop();
                }
                if indents.last() != Some(&col) {
                    indents.push(col);
                }
                if indents.len() > MAX_NESTING {
                    return too_deep(n);
                }
                let rest = &b[col..];
                if rest.first() == Some(&b'-')
                    && rest.get(1).is_none_or(|c| *c == b' ' || *c == b'\t')
                {
                    col += 1 + rest[1..].iter().take_while(|&&c| c == b' ').count();
                    if col < b.len() && b[col] != b'#' {
                        continue;
                    }
                }
                break;
            }
            i = col;
            node_col = col;
        }
        // The character before (a tab reads as a space): what a bracket,
        // quote or `#` follows decides whether it opens something.
        let mut prev = b' ';
        while i < b.len() {
            let c = b[i];
            match quote {
                Some(b'\'') => {
                    if c == b'\'' {
                        if b.get(i + 1) == Some(&b'\'') {
                            i += 1;
                        } else {
                            quote = None;
                        }
                    }
                }
                Some(_) => {
                    if c == b'\\' {
                        i += 1;
                    } else if c == b'"' {
                        quote = None;
                    }
                }
                None => {
                    let after_space = prev == b' ';
                    // Inside a flow collection a node also starts after
                    // these; in block context a word may hold brackets.
                    let node_start = after_space || (flow > 0 && b"[{,:?".contains(&prev));
                    match c {
                        b'#' if after_space => break,
                        b'\'' | b'"' if node_start => quote = Some(c),
                        b'[' | b'{' if flow > 0 || after_space => {
                            flow += 1;
                            if indents.len() + flow > MAX_NESTING {
                                return too_deep(n);
                            }
                        }
                        b']' | b'}' if flow > 0 => flow -= 1,
                        b'|' | b'>' if flow == 0 && after_space => {
                            // A block scalar's header (`|`, `>-`, `|2`)
                            // ends its line; the lines indented past the
                            // node it is in are its text.
                            let tail = &b[i + 1..];
                            let header = tail
                                .iter()
                                .take_while(|c| matches!(c, b'-' | b'+' | b'0'..=b'9'))
                                .count();
                            let mut after = tail[header..].iter().skip_while(|c| **c == b' ');
                            if after.next().is_none_or(|c| *c == b'#') {
                                block_scalar = Some(node_col);
                                break;
                            }
                        }
                        _ => {}
                    }
                }
            }
            prev = if c == b'\t' { b' ' } else { c };
            i += 1;
        }
    }
    Ok(())
}

/// `v` as a mapping, or an error saying what it is instead.
fn object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| at(path, format!("expected a mapping, got {}", kind(v))))
}

/// What a YAML value is, in the words an error message uses ("expected a
/// mapping, got a list").
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Refuses a key outside `allowed`, naming it and listing the allowed
/// ones: a misspelled `requests_per_unit` must not leave a descriptor
/// unlimited. At a reload the whole file set is then refused and the rules
/// in force stay.
fn only_keys(m: &Map<String, Value>, path: &str, allowed: &[&str]) -> Result<()> {
    for k in m.keys() {
        if !allowed.contains(&k.as_str()) {
            return Err(at(
                &join(path, k),
                format!("unknown key (expected one of: {})", allowed.join(", ")),
            ));
        }
    }
    Ok(())
}

/// `path.key`, or `key` at the top.
fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// A string field, absent or null as `None`.
fn string(m: &Map<String, Value>, path: &str, key: &str) -> Result<Option<String>> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        // YAML reads `value: 200` as a number; envoyproxy/ratelimit's Go
        // struct takes it as the string "200", and so does freqcap.
        Some(Value::Number(n)) if key == "value" => Ok(Some(n.to_string())),
        Some(Value::Bool(b)) if key == "value" => Ok(Some(b.to_string())),
        Some(v) => Err(at(
            &join(path, key),
            format!("expected a string, got {}", kind(v)),
        )),
    }
}

/// A boolean field (`shadow_mode`, `detailed_metric`), absent as false,
/// as envoyproxy/ratelimit's zero value.
fn boolean(m: &Map<String, Value>, path: &str, key: &str) -> Result<bool> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(at(
            &join(path, key),
            format!("expected true or false, got {}", kind(v)),
        )),
    }
}

/// A list field, absent or null as empty (a descriptor without nested
/// `descriptors` is a leaf).
fn list<'a>(m: &'a Map<String, Value>, path: &str, key: &str) -> Result<&'a [Value]> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(v) => Err(at(
            &join(path, key),
            format!("expected a list, got {}", kind(v)),
        )),
    }
}

/// One file: its domain, its tree, and how many rules it has.
fn parse_file(doc: &Value) -> Result<(String, Node, usize)> {
    let m = object(doc, "")?;
    only_keys(m, "", &["domain", "descriptors"])?;
    let domain = string(m, "", "domain")?.unwrap_or_default();
    if domain.is_empty() {
        return Err(at("domain", "a non-empty domain is required"));
    }
    let mut root = Node::default();
    let mut count = 0;
    parse_level(
        &mut root,
        list(m, "", "descriptors")?,
        "descriptors",
        "",
        0,
        &mut count,
    )?;
    Ok((domain, root, count))
}

/// One level of a descriptor tree into `node`: each entry's key and value
/// (a value, a wildcard prefix `/api/*`, or any value), its rule if it has
/// one, and its nested level, at most [`MAX_DEPTH`] deep; `count` counts
/// the rules. Two entries with the same key and value are refused: which
/// one applies would otherwise depend on the order they were read in.
fn parse_level(
    node: &mut Node,
    descriptors: &[Value],
    path: &str,
    parent_key: &str,
    depth: usize,
    count: &mut usize,
) -> Result<()> {
    if depth >= MAX_DEPTH {
        return Err(at(
            path,
            format!("descriptors nest at most {MAX_DEPTH} deep"),
        ));
    }
    for (i, d) in descriptors.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let m = object(d, &p)?;
        // envoyproxy/ratelimit's descriptor keys, plus freqcap's `limits`.
        only_keys(
            m,
            &p,
            &[
                "key",
                "value",
                "rate_limit",
                "limits",
                "descriptors",
                "shadow_mode",
                "detailed_metric",
                "value_to_metric",
                "metadata",
                "quota_mode",
                "share_threshold",
            ],
        )?;
        // Refused by name, so they read as unsupported, not misspelled;
        // `false` asks for nothing and passes.
        for unsupported in ["quota_mode", "share_threshold"] {
            if boolean(m, &p, unsupported)? {
                return Err(at(
                    &join(&p, unsupported),
                    "not supported by freqcap (docs/rls.md, \"Differences\")",
                ));
            }
        }
        // Metrics-only options of envoyproxy/ratelimit: accepted, no effect.
        boolean(m, &p, "detailed_metric")?;
        boolean(m, &p, "value_to_metric")?;
        let key = string(m, &p, "key")?.unwrap_or_default();
        if key.is_empty() {
            return Err(at(&join(&p, "key"), "a non-empty key is required"));
        }
        let value = string(m, &p, "value")?.unwrap_or_default();
        // envoyproxy/ratelimit's child key: `key` for any value, else
        // `key_value`, the string `matching::find` builds from an entry.
        let child_key = if value.is_empty() {
            key.clone()
        } else {
            format!("{key}_{value}")
        };
        // The path of keys from the top (`tenant.plan_gold`): the rule's
        // name when `rate_limit.name` is absent, and the duplicate's name.
        let full = if parent_key.is_empty() {
            child_key.clone()
        } else {
            format!("{parent_key}.{child_key}")
        };
        if node.children.contains_key(&child_key) {
            return Err(at(
                &p,
                format!("duplicate descriptor {full:?} (the same key and value twice)"),
            ));
        }
        let shadow = boolean(m, &p, "shadow_mode")?;
        let rule = parse_rule(m, &p, &full, shadow)?;
        if rule.is_some() {
            *count += 1;
        }
        let mut child = Node {
            rule: rule.map(Arc::new),
            ..Node::default()
        };
        let sub = list(m, &p, "descriptors")?;
        parse_level(
            &mut child,
            sub,
            &join(&p, "descriptors"),
            &full,
            depth + 1,
            count,
        )?;
        // Split once here, so matching never parses a pattern per call.
        if child_key.contains('*') {
            node.wildcards.push((
                child_key.split('*').map(str::to_owned).collect(),
                child_key.clone(),
            ));
        }
        node.children.insert(child_key, child);
    }
    Ok(())
}

/// The rule of a descriptor, if it has `rate_limit` or `limits`.
fn parse_rule(
    m: &Map<String, Value>,
    path: &str,
    full: &str,
    shadow: bool,
) -> Result<Option<Rule>> {
    let limits = m.get("limits").filter(|v| !v.is_null());
    let rate_limit = m.get("rate_limit").filter(|v| !v.is_null());
    match (rate_limit, limits) {
        (None, None) => {
            // A level that only nests. `shadow_mode` there is refused: it
            // would read as shadowing the nested rules, which it does not.
            if shadow {
                return Err(at(
                    &join(path, "shadow_mode"),
                    "a descriptor without rate_limit or limits has nothing to shadow",
                ));
            }
            Ok(None)
        }
        (Some(_), Some(_)) => Err(at(
            &join(path, "limits"),
            "give rate_limit or limits, not both",
        )),
        (None, Some(v)) => {
            let p = join(path, "limits");
            // The JSON API's model and bounds (docs/semantics.md §5.1), with
            // its field paths put under this descriptor's `limits`.
            let defs: Vec<LimitDef> = crate::model::from_json(&v.to_string()).map_err(|e| {
                let field = if e.field.is_empty() {
                    p.clone()
                } else if e.field.starts_with('[') {
                    format!("{p}{}", e.field)
                } else {
                    join(&p, &e.field)
                };
                (field, e.message)
            })?;
            let limits = crate::engine::compile_limits_at(&p, &defs).map_err(engine_error)?;
            for (i, item) in limits.stack.items().iter().enumerate() {
                if matches!(item, Item::Concurrency(_) | Item::Adaptive(_)) {
                    return Err(at(
                        &format!("{p}[{i}]"),
                        format!(
                            "a {} limit needs a release, which Envoy's protocol has not",
                            item.kind().as_str()
                        ),
                    ));
                }
            }
            Ok(Some(Rule {
                name: full.to_owned(),
                given_name: None,
                replaces: Vec::new(),
                shadow,
                action: Action::Limit {
                    limits,
                    plain: None,
                },
            }))
        }
        (Some(v), None) => {
            let p = join(path, "rate_limit");
            let r = object(v, &p)?;
            only_keys(
                r,
                &p,
                &["unit", "requests_per_unit", "unlimited", "name", "replaces"],
            )?;
            let unlimited = boolean(r, &p, "unlimited")?;
            let unit_text = string(r, &p, "unit")?;
            // An empty name is no name: the path of keys names the rule.
            let given_name = string(r, &p, "name")?.filter(|n| !n.is_empty());
            let mut replaces = Vec::new();
            for (j, e) in list(r, &p, "replaces")?.iter().enumerate() {
                let ep = format!("{p}.replaces[{j}]");
                let em = object(e, &ep)?;
                only_keys(em, &ep, &["name"])?;
                let n = string(em, &ep, "name")?.unwrap_or_default();
                if n.is_empty() {
                    return Err(at(&join(&ep, "name"), "a non-empty name is required"));
                }
                if given_name.as_deref() == Some(n.as_str()) {
                    return Err(at(
                        &join(&ep, "name"),
                        "a rule cannot replace itself (its own name)",
                    ));
                }
                replaces.push(n);
            }
            let name = given_name.clone().unwrap_or_else(|| full.to_owned());
            let action = if unlimited {
                if unit_text.is_some() {
                    return Err(at(
                        &join(&p, "unit"),
                        "an unlimited rate_limit takes no unit",
                    ));
                }
                Action::Unlimited
            } else {
                let up = join(&p, "unit");
                let text = unit_text.ok_or_else(|| {
                    at(
                        &up,
                        "a unit is required: second, minute, hour, day, week, month or year",
                    )
                })?;
                let unit = Unit::parse(&text).ok_or_else(|| {
                    at(
                        &up,
                        format!(
                            "unknown unit {text:?} (expected second, minute, hour, day, week, month or year)"
                        ),
                    )
                })?;
                let rp = join(&p, "requests_per_unit");
                // Absent is 0, the Go struct's zero value: a block, as in
                // envoyproxy/ratelimit. At most u32::MAX, the width of
                // `current_limit.requests_per_unit` it is reported in.
                let n = match r.get("requests_per_unit") {
                    None | Some(Value::Null) => 0,
                    Some(v) => v
                        .as_u64()
                        .filter(|&n| n <= u64::from(u32::MAX))
                        .ok_or_else(|| {
                            at(
                                &rp,
                                format!("expected a whole number from 0 to {}", u32::MAX),
                            )
                        })?,
                };
                let n = n as u32;
                if n == 0 {
                    Action::Block(unit)
                } else {
                    Action::Limit {
                        limits: plain_window(n, unit).map_err(engine_error)?,
                        plain: Some((n, unit)),
                    }
                }
            };
            Ok(Some(Rule {
                name,
                given_name,
                replaces,
                shadow,
                action,
            }))
        }
    }
}

/// An engine error about a rule's limits, at the field it names.
fn engine_error(e: crate::engine::EngineError) -> (String, String) {
    match e {
        crate::engine::EngineError::InvalidArgument { field, message } => (field, message),
        other => (String::new(), other.to_string()),
    }
}

/// The limit item of a plain `rate_limit`: a fixed window of the unit,
/// counted from the Unix epoch (docs/semantics.md §2.2, "Fixed"). Also
/// the item of a request's `limit` override (`service.rs`).
///
/// Built through the JSON model, so a plain rule is exactly a `limits`
/// item `{kind: window, align: fixed}`. It cannot fail for the figures it
/// gets (1 to 2^32 − 1, at most 365 days: within docs/semantics.md §5.1);
/// an error is still mapped, not unwrapped.
pub fn plain_window(
    requests_per_unit: u32,
    unit: Unit,
) -> std::result::Result<Arc<CompiledInline>, crate::engine::EngineError> {
    let def: LimitDef = serde_json::from_value(serde_json::json!({
        "kind": "window",
        "limit": requests_per_unit,
        "window": format!("{}s", unit.secs()),
        "align": "fixed",
    }))
    .map_err(|e| crate::engine::EngineError::InvalidArgument {
        field: "rate_limit".into(),
        message: e.to_string(),
    })?;
    crate::engine::compile_limits_at("rate_limit", std::slice::from_ref(&def))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> std::result::Result<Rules, ConfigError> {
        Rules::parse(&[("rules.yaml".to_owned(), text.to_owned())])
    }

    #[test]
    fn envoyproxy_ratelimit_example_loads() {
        let r = parse(
            r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: remote_address
    descriptors:
      - key: path
        value: "/api/*"
        rate_limit: {unit: minute, requests_per_unit: 10, name: api}
  - key: vip
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: day, requests_per_unit: 0}
"#,
        )
        .unwrap();
        assert_eq!(r.count, 5);
        let d = &r.domains["mongo_cps"];
        assert!(d.children.contains_key("database_users"));
        let ra = &d.children["remote_address"];
        assert!(ra.rule.is_none());
        assert_eq!(ra.wildcards.len(), 1);
        assert_eq!(
            ra.wildcards[0].0,
            vec!["path_/api/".to_owned(), String::new()]
        );
        let api = ra.children["path_/api/*"].rule.as_ref().unwrap();
        assert_eq!(api.name, "api");
        assert!(matches!(
            d.children["vip"].rule.as_ref().unwrap().action,
            Action::Unlimited
        ));
        assert!(matches!(
            d.children["blocked"].rule.as_ref().unwrap().action,
            Action::Block(Unit::Day)
        ));
    }

    #[test]
    fn errors_name_the_file_and_the_path() {
        for (text, path, words) in [
            ("domain: ''\n", "domain", "non-empty domain"),
            ("descriptors: []\n", "domain", "non-empty domain"),
            (
                "domain: d\ndescriptors:\n  - value: x\n",
                "descriptors[0].key",
                "non-empty key",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
                "descriptors[0].rate_limit.unit",
                "unknown unit \"fortnight\"",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
                "descriptors[0].rate_limit.requests_per_unit",
                "whole number",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
                "descriptors[0].rate_limit.unit",
                "unlimited",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1, colour: red}\n",
                "descriptors[0].descriptors[0].rate_limit.colour",
                "unknown key",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n  - key: a\n",
                "descriptors[1]",
                "duplicate descriptor \"a\"",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    limits:\n      - {kind: rate, rate: 0, per: 1s}\n",
                "descriptors[0].limits[0].rate",
                "",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    limits:\n      - {kind: rate, rate: 1, per: 1s, colour: red}\n",
                "descriptors[0].limits[0]",
                "colour",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    limits:\n      - {kind: concurrency, max: 3}\n",
                "descriptors[0].limits[0]",
                "release",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    limits:\n      - {kind: adaptive, max: 3}\n",
                "descriptors[0].limits[0]",
                "release",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    limits: [{kind: rate, rate: 1, per: 1s}]\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
                "descriptors[0].limits",
                "not both",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
                "descriptors[0].quota_mode",
                "not supported",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}\n",
                "descriptors[0].rate_limit.replaces[0].name",
                "itself",
            ),
            (
                "domain: d\ndescriptors: {key: a}\n",
                "descriptors",
                "expected a list",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.file, "rules.yaml", "{text}");
            assert!(
                e.path.starts_with(path),
                "{text}: path {:?}, wanted {path:?} ({e})",
                e.path
            );
            assert!(e.to_string().contains(words), "{text}: {e}");
            assert!(e.to_string().starts_with("rules.yaml: "), "{e}");
        }
        let e = parse("domain: [unclosed\n").unwrap_err();
        assert!(e.message.contains("not valid YAML"), "{e}");
    }

    /// Deep nesting is refused by a linear scan before the YAML parser sees
    /// it (libyaml's scan of 200 000 nested `[` took minutes; case 1.41 of
    /// the turn-3 probe), naming the file and the line.
    #[test]
    fn deep_nesting_is_refused_before_parsing() {
        let deep = 200_000;
        let (open, close) = ("[".repeat(deep), "]".repeat(deep));
        // After a key on its line, where libyaml's time is quadratic.
        let flow = format!("domain: d\ndescriptors: {open}{close}\n");
        let e = parse(&flow).unwrap_err();
        assert_eq!(e.file, "rules.yaml");
        assert!(
            e.message.starts_with("line 2: ") && e.message.contains("nest more than 64"),
            "{e}"
        );
        let flow = format!("domain: d\ndescriptors:\n  {open}{close}\n");
        let e = parse(&flow).unwrap_err();
        assert!(e.message.starts_with("line 3: "), "{e}");
        let mapping = format!("domain: d\ndescriptors: {}\n", "{a: ".repeat(deep));
        let e = parse(&mapping).unwrap_err();
        assert!(e.message.starts_with("line 2: "), "{e}");
        // Block nesting, by indentation and by `- - -` on one line.
        let mut block = String::from("domain: d\n");
        for i in 0..100 {
            block.push_str(&format!("{}k{i}:\n", " ".repeat(i)));
        }
        let e = parse(&block).unwrap_err();
        assert!(e.message.starts_with("line 66: "), "{e}");
        let dashes = format!("domain: d\ndescriptors:\n{}x\n", "- ".repeat(100));
        let e = parse(&dashes).unwrap_err();
        assert!(e.message.starts_with("line 3: "), "{e}");
        // Brackets in quotes, comments and words are not nesting.
        let quoted = format!(
            "domain: d\n# {open}\ndescriptors:\n  - key: k\n    value: \"{open}\"\n  - key: '{open}'\n  - key: a{open}\n",
            open = "[".repeat(100)
        );
        assert_eq!(parse(&quoted).unwrap().domains["d"].children.len(), 3);
    }

    /// Descriptors at the deepest level allowed, written in block style or
    /// in flow style, are within the scan's bound.
    #[test]
    fn the_deepest_descriptors_pass_the_scan() {
        // The last level's (empty) descriptors count as one: 15 levels.
        let levels = MAX_DEPTH - 1;
        let mut block = String::from("domain: d\ndescriptors:\n");
        for i in 0..levels {
            let pad = "  ".repeat(2 * i);
            block.push_str(&format!("{pad}- key: k{i}\n"));
            if i + 1 < levels {
                block.push_str(&format!("{pad}  descriptors:\n"));
            } else {
                block.push_str(&format!(
                    "{pad}  limits: [{{kind: rate, rate: 1, per: 1s}}]\n"
                ));
            }
        }
        assert_eq!(parse(&block).unwrap().count, 1, "{block}");
        let mut flow = String::from("domain: d\ndescriptors: ");
        for i in 0..levels {
            flow.push_str(&format!("[{{key: k{i}, descriptors: "));
        }
        flow.push_str("[]");
        flow.push_str(&"}]".repeat(levels));
        flow.push('\n');
        assert!(parse(&flow).is_ok(), "{flow}");
    }

    #[test]
    fn one_domain_per_file() {
        let f = |n: &str| (n.to_owned(), "domain: d\ndescriptors: []\n".to_owned());
        let e = Rules::parse(&[f("a.yaml"), f("b.yaml")]).unwrap_err();
        assert_eq!(e.file, "b.yaml");
        assert!(e.message.contains("already defined"), "{e}");
    }
}
