//! Which rule a descriptor matches: envoyproxy/ratelimit's walk
//! (`GetLimit` in its `src/config/config_impl.go`), written out in
//! docs/rls.md, "Matching". Pure.
//!
//! For each entry in order: the child named `key_value`, else the first
//! wildcard child whose pattern matches `key_value`, else the child named
//! `key` (any value). The rule is the one of the child the **last** entry
//! reaches; a rule met half way applies to nothing, and an entry that finds
//! no child ends the walk with no rule.
//!
//! Run per descriptor of every call (`service.rs`) on the tree
//! [`super::config`] built, it parses nothing (patterns were split at
//! load) and allocates one buffer per descriptor.

use std::sync::Arc;

use super::config::{Node, Rule};

/// The rule `entries` (key, value pairs) reach under `root`, if any.
/// `None` sends the descriptor back `OK` with nothing counted (docs/rls.md,
/// "Matching"), so a descriptor no rule names never limits a request.
pub fn find<'a>(root: &'a Node, entries: &[(&str, &str)]) -> Option<&'a Arc<Rule>> {
    let mut level = root;
    // `key_value` of the current entry, the form children are keyed by;
    // one buffer reused for every entry of the descriptor.
    let mut buf = String::new();
    for (i, (key, value)) in entries.iter().enumerate() {
        buf.clear();
        buf.push_str(key);
        buf.push('_');
        buf.push_str(value);
        // Most specific first, as `GetLimit` tries them: the exact value,
        // then the wildcards in file order, then the key with any value.
        let next = level
            .children
            .get(&buf)
            .or_else(|| {
                level
                    .wildcards
                    .iter()
                    .find(|(parts, _)| wildcard_match(parts, &buf))
                    .and_then(|(_, k)| level.children.get(k))
            })
            .or_else(|| level.children.get(*key))?;
        if i + 1 == entries.len() {
            // The last entry decides; its child may have no rule of its own
            // (a level that only nests), and then nothing applies.
            return next.rule.as_ref();
        }
        // More entries than the tree is deep here: no rule, not the rule
        // of this shallower level.
        if next.children.is_empty() {
            return None;
        }
        level = next;
    }
    None
}

/// Whether `value` matches a pattern split at its `*`s: each `*` stands for
/// any run of characters, possibly empty. Both ends are anchored and the
/// pattern is the whole `key_value` (`path_/api/*`), so it never matches
/// inside a longer value (`path_/v2/api/x`).
pub fn wildcard_match(parts: &[String], value: &str) -> bool {
    // One part: a pattern without `*`, compared whole.
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| p == value);
    };
    // A quick refusal: the fixed parts alone are longer than the value.
    if value.len() < parts.iter().map(String::len).sum::<usize>() {
        return false;
    }
    // The first part is a prefix and the last a suffix (an empty one, from
    // a leading or trailing `*`, matches anything); stripping one and then
    // the other keeps them from overlapping (`ab*ba` against `aba`).
    let Some(mut rest) = value.strip_prefix(first.as_str()) else {
        return false;
    };
    let Some(r) = rest.strip_suffix(last.as_str()) else {
        return false;
    };
    rest = r;
    // Each middle part at its leftmost place after the one before: taking
    // the earliest match leaves the most room for the parts after it, so
    // this never refuses a value some other placement would match.
    for part in middle {
        match rest.find(part.as_str()) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rls::config::Rules;

    fn rules() -> Rules {
        Rules::parse(&[(
            "r.yaml".into(),
            r#"
domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 10.0.0.1
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: path
    value: "/api/*"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    value: "/a*b*c"
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 50}
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: minute, requests_per_unit: 500}
"#
            .into(),
        )])
        .unwrap()
    }

    fn limit_of(r: &Rules, entries: &[(&str, &str)]) -> Option<String> {
        find(&r.domains["d"], entries).map(|rule| rule.name.clone())
    }

    #[test]
    fn matches_as_envoyproxy_ratelimit_does() {
        let r = rules();
        let f = |e: &[(&str, &str)]| limit_of(&r, e);
        // key_value before key.
        assert_eq!(
            f(&[("remote_address", "10.0.0.1")]).as_deref(),
            Some("remote_address_10.0.0.1")
        );
        assert_eq!(
            f(&[("remote_address", "10.0.0.2")]).as_deref(),
            Some("remote_address")
        );
        // Wildcards: trailing and inner.
        assert_eq!(f(&[("path", "/api/users")]).as_deref(), Some("path_/api/*"));
        assert_eq!(f(&[("path", "/api/")]).as_deref(), Some("path_/api/*"));
        assert_eq!(f(&[("path", "/axxbyyc")]).as_deref(), Some("path_/a*b*c"));
        assert_eq!(f(&[("path", "/abc")]).as_deref(), Some("path_/a*b*c"));
        assert_eq!(f(&[("path", "/ab")]), None);
        assert_eq!(f(&[("path", "/other")]), None);
        // The last entry's rule; a rule met half way is not applied.
        assert_eq!(f(&[("tenant", "t1")]).as_deref(), Some("tenant"));
        assert_eq!(
            f(&[("tenant", "t1"), ("plan", "gold")]).as_deref(),
            Some("tenant.plan_gold")
        );
        assert_eq!(f(&[("tenant", "t1"), ("plan", "free")]), None);
        // Deeper than the tree, or an unknown first key: no rule.
        assert_eq!(f(&[("remote_address", "x"), ("path", "/api/x")]), None);
        assert_eq!(f(&[("nothing", "x")]), None);
    }

    #[test]
    fn wildcard_patterns() {
        let p = |s: &str| s.split('*').map(str::to_owned).collect::<Vec<_>>();
        assert!(wildcard_match(&p("a*"), "a"));
        assert!(wildcard_match(&p("*"), ""));
        assert!(wildcard_match(&p("a*c"), "abc"));
        assert!(!wildcard_match(&p("a*c"), "ab"));
        assert!(!wildcard_match(&p("ab*ba"), "aba"));
        assert!(wildcard_match(&p("a*b*c"), "a_b_b_c"));
        assert!(!wildcard_match(&p("a*b*c"), "a_c_b"));
        assert!(wildcard_match(&p("exact"), "exact"));
        assert!(!wildcard_match(&p("exact"), "exactly"));
    }
}
