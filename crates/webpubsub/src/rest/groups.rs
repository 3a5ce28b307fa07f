//! `/api/hubs/{hub}/groups/{group}…`: existence, `:send`, `:closeConnections`, adding and
//! removing connections, and the paged member listing.
//!
//! Listing pages by connection id (members are kept ordered): the continuation token is
//! the last id returned, base64url so it survives any query encoding, and `nextLink` is
//! the absolute URL of the next page (what the JS SDK follows as is and the Python SDK
//! re-reads the query of). `top` caps the total across pages, so `nextLink` carries the
//! remainder; a page is followed by a `nextLink` only when more members remain.

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde::Serialize;

use super::targets::{close, send};
use super::{check_group, check_id, found, hub_params, origin, ApiError, ApiResult, Params};
use crate::cluster::{Operation, Question, To};
use crate::hub::admin::{JoinError, Target};
use crate::WebPubSub;

/// Page size when the caller gives none, and the most it may ask for.
pub(super) const MAX_PAGE_SIZE: i64 = 200;

fn checked(hub: &str, group: &str, query: Option<&str>) -> ApiResult<Params> {
    let params = hub_params(hub, query)?;
    check_group(group)?;
    Ok(params)
}

/// `HEAD …/groups/{group}`: 200 when it has members, else 404.
pub(super) async fn exists(
    State(state): State<WebPubSub>,
    Path((hub, group)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    checked(&hub, &group, query.as_deref())?;
    let hub = state.hub(&hub);
    let here = hub.has_group(&group);
    let question = Question::Group { name: group };
    Ok(found(hub.exists_anywhere(question, here).await?))
}

/// `POST …/groups/{group}/:send` and `…/:closeConnections`.
pub(super) async fn action(
    State(state): State<WebPubSub>,
    Path((hub, group, action)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let params = checked(&hub, &group, query.as_deref())?;
    match action.as_str() {
        ":send" => send(&state, &hub, Target::Group(&group), &params, &headers, body).await,
        ":closeConnections" => close(&state, &hub, Target::Group(&group), &params).await,
        _ => Err(ApiError::NotFound(format!("No group action {action:?}"))),
    }
}

/// `PUT …/groups/{group}/connections/{connection}`: 200, or 404 for a missing connection.
pub(super) async fn add_connection(
    State(state): State<WebPubSub>,
    Path((hub, group, connection)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    checked(&hub, &group, query.as_deref())?;
    check_id("connection id", &connection)?;
    let hub = state.hub(&hub);
    let not_found = || ApiError::NotFound(format!("Connection '{connection}' does not exist"));
    match hub.add_connection_to_group(&connection, &group) {
        Ok(()) => Ok(StatusCode::OK),
        Err(JoinError::TooManyGroups(e)) => Err(ApiError::BadRequest(e.to_string())),
        Err(JoinError::NotFound(_)) => {
            if !hub
                .exists_anywhere(
                    Question::Connection {
                        id: connection.clone(),
                    },
                    false,
                )
                .await?
            {
                return Err(not_found());
            }
            hub.broadcast_written(&Operation::Join {
                hub: hub.name().to_owned(),
                to: To::Connection(connection.clone()),
                group,
            })
            .await?;
            Ok(StatusCode::OK)
        }
    }
}

/// `DELETE …/groups/{group}/connections/{connection}`: 204.
pub(super) async fn remove_connection(
    State(state): State<WebPubSub>,
    Path((hub, group, connection)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    checked(&hub, &group, query.as_deref())?;
    check_id("connection id", &connection)?;
    let hub = state.hub(&hub);
    if !hub.has_connection(&connection) {
        hub.broadcast_written(&Operation::Leave {
            hub: hub.name().to_owned(),
            to: To::Connection(connection.clone()),
            group: Some(group.clone()),
        })
        .await?;
    }
    hub.remove_connection_from_group(&connection, &group);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct MemberOut {
    connection_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_id: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Page {
    value: Vec<MemberOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_link: Option<String>,
}

/// `GET …/groups/{group}/connections`: one page of members.
pub(super) async fn list(
    State(state): State<WebPubSub>,
    Path((hub, group)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let params = checked(&hub, &group, query.as_deref())?;
    let page_size = params
        .int("maxpagesize", 1, MAX_PAGE_SIZE)?
        .unwrap_or(MAX_PAGE_SIZE);
    let top = params.int("top", 1, i64::from(i32::MAX))?;
    let after = match params.get("continuationToken").filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => Some(
            URL_SAFE_NO_PAD
                .decode(t)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| ApiError::BadRequest("Invalid continuationToken".into()))?,
        ),
    };
    let limit = top.map_or(page_size, |t| t.min(page_size));
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let (members, more) = (state.hub(&hub))
        .list_group_anywhere(&group, after.as_deref(), limit)
        .await?;
    let remaining = top.map(|t| t - i64::try_from(members.len()).unwrap_or(i64::MAX));
    let next_top = match remaining {
        None => Some(None),
        Some(r) if r > 0 => Some(Some(r)),
        Some(_) => None,
    };
    let next_link = next_top.filter(|_| more && !members.is_empty()).map(|top| {
        let mut link = format!(
            "{}/api/hubs/{}/groups/{}/connections?api-version={}&maxpagesize={page_size}",
            origin(&headers),
            utf8_percent_encode(&hub, NON_ALPHANUMERIC),
            utf8_percent_encode(&group, NON_ALPHANUMERIC),
            utf8_percent_encode(
                params.get("api-version").unwrap_or_default(),
                NON_ALPHANUMERIC
            ),
        );
        if let Some(top) = top {
            link.push_str(&format!("&top={top}"));
        }
        let last = members.last().map_or("", |m| m.connection_id.as_str());
        link.push_str(&format!(
            "&continuationToken={}",
            URL_SAFE_NO_PAD.encode(last)
        ));
        link
    });
    let page = Page {
        value: members
            .into_iter()
            .map(|m| MemberOut {
                connection_id: m.connection_id,
                user_id: m.user_id,
            })
            .collect(),
        next_link,
    };
    Ok(Json(page).into_response())
}
