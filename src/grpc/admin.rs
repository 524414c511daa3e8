//! `freqcap.v1.Admin`: policies and campaigns, as HTTP's `PUT`/`GET`/`DELETE
//! /v1/policies/{name}` and `/v1/campaigns/{id}`. Changing definitions takes
//! the admin token (or, with none set, the decision token), reading them
//! either token, as over HTTP: checked on the call's headers before it gets
//! here (src/grpc/guard.rs, the rule of src/api/guard.rs).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{convert, pb};
use crate::clock::Clock;
use crate::front::call::blocking;
use crate::front::error::status;
use crate::front::{AppState, FrontError};

/// A definition's warnings as `freqcap-warning` metadata, one value each
/// (`<field>: <message>`), as HTTP's `Freqcap-Warning` headers.
fn with_warnings<T>(mut r: Response<T>, warnings: &[crate::model::Warning]) -> Response<T> {
    for w in warnings {
        if let Ok(v) = format!("{}: {}", w.field, w.message).parse() {
            r.metadata_mut().append("freqcap-warning", v);
        }
    }
    r
}

/// The Admin service over the one engine every front shares: definitions
/// written here are the ones HTTP, RESP and RLS decide by at once.
pub struct Service<C: Clock> {
    state: Arc<AppState<C>>,
}

impl<C: Clock + 'static> Service<C> {
    /// The service over the server's shared state (one per listener).
    pub fn new(state: Arc<AppState<C>>) -> Self {
        Service { state }
    }

    /// An id over the length limit is INVALID_ARGUMENT naming it, as HTTP's
    /// path parameters are.
    fn id(&self, field: &str, v: &str) -> Result<(), Status> {
        crate::front::call::id_param(&self.state, field, v).map_err(status)
    }
}

/// NOT_FOUND with HTTP's 404 message, so an operator's script that moved
/// from HTTP matches the same words.
fn not_found(what: &str, name: &str) -> Status {
    status(FrontError::not_found(format!("no {what} named {name:?}")))
}

#[tonic::async_trait]
impl<C: Clock + 'static> pb::admin_server::Admin for Service<C> {
    async fn put_policy(
        &self,
        req: Request<pb::PutPolicyRequest>,
    ) -> Result<Response<pb::Policy>, Status> {
        let r = req.into_inner();
        self.id("name", &r.name)?;
        let def = convert::policy_def(r.policy.unwrap_or_default()).map_err(status)?;
        let e = self.state.engine.clone();
        let stored = def.clone();
        let warnings = blocking(move || e.put_policy_as(&r.name, def, r.reset))
            .await
            .map_err(status)?;
        crate::front::call::log_warnings(&warnings);
        Ok(with_warnings(
            Response::new(convert::policy(&stored)),
            &warnings,
        ))
    }

    async fn get_policy(
        &self,
        req: Request<pb::GetPolicyRequest>,
    ) -> Result<Response<pb::Policy>, Status> {
        let name = req.into_inner().name;
        self.id("name", &name)?;
        match self.state.engine.get_policy(&name) {
            Some(p) => Ok(Response::new(convert::policy(&p))),
            None => Err(not_found("policy", &name)),
        }
    }

    async fn delete_policy(
        &self,
        req: Request<pb::DeletePolicyRequest>,
    ) -> Result<Response<pb::Deleted>, Status> {
        let name = req.into_inner().name;
        self.id("name", &name)?;
        let e = self.state.engine.clone();
        blocking(move || e.delete_policy(&name))
            .await
            .map_err(status)?;
        Ok(Response::new(pb::Deleted {}))
    }

    async fn reset_key(
        &self,
        req: Request<pb::ResetKeyRequest>,
    ) -> Result<Response<pb::Deleted>, Status> {
        let r = req.into_inner();
        self.id("name", &r.name)?;
        let e = self.state.engine.clone();
        blocking(move || e.reset_key(&r.name, &r.key))
            .await
            .map_err(status)?;
        Ok(Response::new(pb::Deleted {}))
    }

    async fn erase_identity(
        &self,
        req: Request<pb::EraseIdentityRequest>,
    ) -> Result<Response<pb::Deleted>, Status> {
        let r = req.into_inner();
        let kind = if r.kind.is_empty() {
            "user".to_owned()
        } else {
            r.kind
        };
        let e = self.state.engine.clone();
        blocking(move || e.erase(&kind, &r.id))
            .await
            .map_err(status)?;
        Ok(Response::new(pb::Deleted {}))
    }

    async fn put_campaign(
        &self,
        req: Request<pb::PutCampaignRequest>,
    ) -> Result<Response<pb::Campaign>, Status> {
        let r = req.into_inner();
        self.id("id", &r.id)?;
        let def = convert::campaign_def(r.campaign.unwrap_or_default()).map_err(status)?;
        let e = self.state.engine.clone();
        let stored = def.clone();
        let warnings = blocking(move || e.put_campaign_as(&r.id, def, r.reset))
            .await
            .map_err(status)?;
        crate::front::call::log_warnings(&warnings);
        Ok(with_warnings(
            Response::new(convert::campaign(&stored)),
            &warnings,
        ))
    }

    async fn get_campaign(
        &self,
        req: Request<pb::GetCampaignRequest>,
    ) -> Result<Response<pb::Campaign>, Status> {
        let id = req.into_inner().id;
        self.id("id", &id)?;
        match self.state.engine.get_campaign(&id) {
            Some(c) => Ok(Response::new(convert::campaign(&c))),
            None => Err(not_found("campaign", &id)),
        }
    }

    async fn delete_campaign(
        &self,
        req: Request<pb::DeleteCampaignRequest>,
    ) -> Result<Response<pb::Deleted>, Status> {
        let id = req.into_inner().id;
        self.id("id", &id)?;
        let e = self.state.engine.clone();
        blocking(move || e.delete_campaign(&id))
            .await
            .map_err(status)?;
        Ok(Response::new(pb::Deleted {}))
    }
}
