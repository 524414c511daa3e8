//! `POST /v1/events`: impressions that happened without a reservation,
//! counted (not checked), deduplicated by `event_id`.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::St;
use super::request::*;
use crate::clock::Clock;
use crate::cluster::owners::Owner;
use crate::engine::Event;
use crate::front::FrontError;
use crate::front::call::*;
use crate::front::forward;

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// An impression that happened without a reservation: counted, not checked.
pub(crate) struct EventBody {
    #[serde(default)]
    user: Option<String>,
    /// The viewer's identities by kind (`{"household": "h7"}`), as a screen's.
    #[serde(default)]
    #[schemars(extend("maxProperties" = 8))]
    ids: std::collections::BTreeMap<String, String>,
    campaign: String,
    /// Budget units (default 1).
    #[serde(default = "one")]
    #[schemars(range(max = crate::MAX_EXACT))]
    cost: u64,
    /// Counted once within the dedupe horizon (default 24 h).
    #[serde(default)]
    event_id: Option<String>,
    /// "impression" (default), "click", ...: only caps and budgets counting
    /// this type count it (docs/semantics.md §6.9).
    #[serde(default, rename = "type")]
    #[schemars(regex(pattern = r"^[a-z][a-z0-9_]{0,15}$"))]
    event_type: Option<String>,
}

/// `POST /v1/events`: one event or an array of them.
pub(crate) enum EventsBody {
    One(EventBody),
    List(Vec<Object<EventBody>>),
}

impl<'de> Deserialize<'de> for EventsBody {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
        struct OneOrList;
        impl<'de> serde::de::Visitor<'de> for OneOrList {
            type Value = EventsBody;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an event object or an array of them")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, m: A) -> Result<EventsBody, A::Error> {
                EventBody::deserialize(MapAccessDeserializer::new(m)).map(EventsBody::One)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, s: A) -> Result<EventsBody, A::Error> {
                Vec::deserialize(SeqAccessDeserializer::new(s)).map(EventsBody::List)
            }
        }
        d.deserialize_any(OneOrList)
    }
}

#[derive(Serialize, JsonSchema)]
pub(crate) struct EventsAnswer {
    /// Events counted now (not duplicates of ones already counted).
    counted: usize,
    /// Events whose `event_id` was already counted within the dedupe horizon.
    duplicates: usize,
}

pub(crate) async fn events<C: Clock + 'static>(
    State(s): St<C>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, FrontError> {
    // One event object, or an array of them; each element must be an object
    // (not read positionally), and a member given twice is an error.
    let list = match parse::<EventsBody>(b)? {
        EventsBody::One(e) => vec![e],
        EventsBody::List(v) => v.into_iter().map(|Object(e)| e).collect(),
    };
    let n = list.len();
    // Owner mode: each other owner's events go to it, in one request per
    // owner; the rest are counted here (docs/cluster.md, "Owner mode").
    let mut here = Vec::with_capacity(n);
    let mut away: Vec<(Owner, Vec<serde_json::Value>)> = Vec::new();
    for (i, e) in list.into_iter().enumerate() {
        let (user, ids) = crate::engine::split_ids(e.user, e.ids).map_err(|x| at_index(x, i, n))?;
        let owner = user.as_deref().and_then(|u| s.engine.owner_of_user(u));
        match owner {
            Some(o @ Owner::Other { .. }) if !headers.contains_key(forward::FORWARDED) => {
                let ids: std::collections::BTreeMap<_, _> = ids.into_iter().collect();
                let json = serde_json::json!({
                    "user": user, "ids": ids, "campaign": e.campaign, "cost": e.cost,
                    "event_id": e.event_id, "type": e.event_type,
                });
                match away.iter_mut().find(|(x, _)| *x == o) {
                    Some((_, v)) => v.push(json),
                    None => away.push((o, vec![json])),
                }
            }
            _ => here.push(Event {
                user,
                ids,
                campaign: e.campaign,
                cost: e.cost,
                event_id: e.event_id,
                event_type: e.event_type,
            }),
        }
    }
    // An empty request is the engine's to refuse (400), so it is asked.
    let mut counted = if here.is_empty() && !away.is_empty() {
        0
    } else {
        count_events(&s, here).await?
    };
    for (owner, list) in away {
        let body = Bytes::from(serde_json::to_vec(&list).map_err(FrontError::internal)?);
        let Some(r) = s
            .forwarder
            .to_owner(Some(owner), Method::POST, "/v1/events", &headers, body)
            .await
        else {
            continue;
        };
        let r = r?;
        if !r.status().is_success() {
            // The owner's refusal as it gave it (a 404 for an unknown
            // campaign stays a 404). Events other parts of the request
            // counted stay counted (docs/cluster.md: events split between
            // owners should carry `event_id`, so that a retry counts each
            // once).
            return Ok(r);
        }
        counted += forwarded_count(r).await?;
    }
    Ok(Json(EventsAnswer {
        counted,
        duplicates: n - counted,
    })
    .into_response())
}

/// The count an owner's answer (a success) to forwarded events gives.
async fn forwarded_count(r: Response) -> Result<usize, FrontError> {
    let bytes = axum::body::to_bytes(r.into_body(), 1 << 20)
        .await
        .map_err(|e| {
            FrontError::unavailable(format!("an owner's answer could not be read: {e}"))
        })?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    v["counted"]
        .as_u64()
        .map(|c| c as usize)
        .ok_or_else(|| FrontError::unavailable("an owner's answer to events had no count"))
}

/// An error about one event of a batch of `n`, its field named as the
/// engine names a batch's (`[2].ids.user`).
fn at_index(e: crate::engine::EngineError, i: usize, n: usize) -> crate::engine::EngineError {
    match e {
        crate::engine::EngineError::InvalidArgument { field, message } if n > 1 => {
            crate::engine::EngineError::InvalidArgument {
                field: format!("[{i}].{field}"),
                message,
            }
        }
        e => e,
    }
}
