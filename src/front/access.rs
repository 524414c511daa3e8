//! Who may call what, the one access rule of every front: HTTP and gRPC
//! read the bearer token from the same headers (gRPC's metadata), RESP from
//! `AUTH` ([`token_matches`]). With only an admin token set, HTTP once left
//! decisions open while gRPC and RESP required it (security probe, case
//! 1.6): one rule here, so the fronts cannot drift again.

use axum::http::{HeaderMap, header};

use super::FrontOptions;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Probes, scrapes and the API's description: no client data, and a probe
    /// must reach an overloaded or misconfigured service.
    Public,
    /// Decisions and reads: the decision token or the admin token.
    Decision,
    /// Changing definitions or the service: the admin token (or, with no
    /// admin token set, the decision token: setting one token never leaves
    /// definitions open).
    Admin,
}

/// Whether the request carries the token `access` needs: the one access
/// rule of every front (HTTP here, gRPC's metadata is the same headers).
pub(crate) fn authorized(o: &FrontOptions, access: Access, headers: &HeaderMap) -> bool {
    let admin_ok = o
        .admin_token
        .as_deref()
        .is_some_and(|t| bearer_matches(headers, t));
    match access {
        Access::Public => true,
        Access::Admin => match (&o.admin_token, &o.decision_token) {
            (Some(_), _) => admin_ok,
            (None, Some(t)) => bearer_matches(headers, t),
            (None, None) => true,
        },
        // With any token set, decisions and reads need one: with only an
        // admin token, HTTP left them open while gRPC and RESP required it
        // (security probe, case 1.6). One rule for every front.
        Access::Decision => match (&o.admin_token, &o.decision_token) {
            (None, None) => true,
            (_, Some(t)) => admin_ok || bearer_matches(headers, t),
            (Some(_), None) => admin_ok,
        },
    }
}

/// Whether the request's bearer token is `want`.
fn bearer_matches(headers: &HeaderMap, want: &str) -> bool {
    // The scheme name is case-insensitive (RFC 9110 §11.1).
    let Some(got) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
    else {
        return false;
    };
    token_matches(got.as_bytes(), want)
}

/// Compares a token in constant time (for tokens of the same length; a
/// length mismatch returns early, which reveals only the length).
pub(crate) fn token_matches(got: &[u8], want: &str) -> bool {
    let want = want.as_bytes();
    got.len() == want.len() && got.iter().zip(want).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A token the service can be started with: non-empty, visible ASCII only
/// (a token with a space or a control character could never be sent in a
/// header and matched). `Err` says why, for the field named by the caller.
pub fn check_token(token: &str) -> Result<(), String> {
    if token.is_empty() {
        return Err("must not be empty (leave it unset to keep the endpoints open)".into());
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("must be visible ASCII characters only, without spaces".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_must_be_sendable() {
        assert!(check_token("").is_err());
        assert!(check_token("a b").is_err());
        assert!(check_token("tok\u{0}").is_err());
        assert!(check_token("s3cr3t-_.~+/=").is_ok());
    }
}
