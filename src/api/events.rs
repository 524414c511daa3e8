//! `POST /v1/events`: impressions that happened without a reservation,
//! counted (not checked), deduplicated by `event_id`.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ApiError;
use super::St;
use super::request::*;
use crate::clock::Clock;
use crate::engine::Event;

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// An impression that happened without a reservation: counted, not checked.
pub(crate) struct EventBody {
    #[serde(default)]
    user: Option<String>,
    campaign: String,
    /// Budget units (default 1).
    #[serde(default = "one")]
    #[schemars(range(max = 9007199254740991u64))]
    cost: u64,
    /// Counted once within the dedupe horizon (default 24 h).
    #[serde(default)]
    event_id: Option<String>,
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
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<EventsAnswer>, ApiError> {
    // One event object, or an array of them; each element must be an object
    // (not read positionally), and a member given twice is an error.
    let list = match parse::<EventsBody>(b)? {
        EventsBody::One(e) => vec![e],
        EventsBody::List(v) => v.into_iter().map(|Object(e)| e).collect(),
    };
    let n = list.len();
    let evs: Vec<Event> = list
        .into_iter()
        .map(|e| Event {
            user: e.user,
            campaign: e.campaign,
            cost: e.cost,
            event_id: e.event_id,
        })
        .collect();
    let counted = count_events(&s, evs).await?;
    Ok(Json(EventsAnswer {
        counted,
        duplicates: n - counted,
    }))
}
