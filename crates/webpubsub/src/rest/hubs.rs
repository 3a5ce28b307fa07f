//! The hub-wide actions `POST /api/hubs/{hub}/:{action}`: `:send`, `:closeConnections`,
//! `:generateToken`, `:addToGroups`, `:removeFromGroups`.

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::targets::{close, read_body, send};
use super::{check_group, hub_params, optional_filter, token, ApiError, ApiResult};
use crate::cluster::Operation;
use crate::hub::admin::Target;
use crate::WebPubSub;

/// Body of `:addToGroups` and `:removeFromGroups`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupsRequest {
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    filter: Option<String>,
}

/// `POST /api/hubs/{hub}/{action}`.
pub(super) async fn action(
    State(state): State<WebPubSub>,
    Path((hub, action)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let params = hub_params(&hub, query.as_deref())?;
    match action.as_str() {
        ":send" => Ok(send(&state, &hub, Target::All, &params, &headers, body)
            .await?
            .into_response()),
        ":closeConnections" => Ok(close(&state, &hub, Target::All, &params)
            .await?
            .into_response()),
        ":generateToken" => token::generate(&state, &hub, &params, &headers),
        ":addToGroups" | ":removeFromGroups" => {
            let limit = state.config().limits.max_frame_bytes;
            let bytes = read_body(&headers, body, limit).await?;
            let req: GroupsRequest = serde_json::from_slice(&bytes).map_err(|e| {
                ApiError::BadRequest(format!("Invalid body: {e}; expected {{groups, filter}}"))
            })?;
            for g in &req.groups {
                check_group(g)?;
            }
            let filter = optional_filter(req.filter.as_deref())?;
            let hub = state.hub(&hub);
            hub.broadcast_written(&Operation::Groups {
                hub: hub.name().to_owned(),
                groups: req.groups.clone(),
                filter: filter.is_some().then(|| req.filter.clone()).flatten(),
                join: action == ":addToGroups",
            })
            .await?;
            if action == ":addToGroups" {
                hub.add_filtered_to_groups(&req.groups, filter.as_ref());
            } else {
                hub.remove_filtered_from_groups(&req.groups, filter.as_ref());
            }
            Ok(StatusCode::OK.into_response())
        }
        _ => Err(ApiError::NotFound(format!("No hub action {action:?}"))),
    }
}
