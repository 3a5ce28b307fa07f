//! `/api/hubs/{hub}/connections/{connection}…` and
//! `/api/hubs/{hub}/permissions/{permission}/connections/{connection}`: existence,
//! closing, `:send`, leaving every group, and permissions.
//!
//! Status codes follow the service as the SDKs' tests pin them: granting to a missing
//! connection is 404, revoking from one is 204, closing one is 204, and a permission
//! check answers 200 or 404. `targetName` is the group; without it a grant or revoke is
//! for every group.

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};

use super::targets::{self, send};
use super::{check_group, check_id, found, hub_params, ApiError, ApiResult, Params};
use crate::cluster::{Operation, Question, To};
use crate::hub::admin::{Permission, Target};
use crate::WebPubSub;

fn checked(hub: &str, connection: &str, query: Option<&str>) -> ApiResult<Params> {
    let params = hub_params(hub, query)?;
    check_id("connection id", connection)?;
    Ok(params)
}

/// `HEAD …/connections/{connection}`: 200 or 404.
pub(super) async fn exists(
    State(state): State<WebPubSub>,
    Path((hub, connection)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    checked(&hub, &connection, query.as_deref())?;
    let hub = state.hub(&hub);
    let here = hub.has_connection(&connection);
    Ok(found(
        hub.exists_anywhere(Question::Connection { id: connection }, here)
            .await?,
    ))
}

/// `DELETE …/connections/{connection}?reason=`: 204.
pub(super) async fn close(
    State(state): State<WebPubSub>,
    Path((hub, connection)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    let params = checked(&hub, &connection, query.as_deref())?;
    targets::close(&state, &hub, Target::Connection(&connection), &params).await
}

/// `POST …/connections/{connection}/:send`: 202.
pub(super) async fn action(
    State(state): State<WebPubSub>,
    Path((hub, connection, action)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let params = checked(&hub, &connection, query.as_deref())?;
    match action.as_str() {
        ":send" => {
            send(
                &state,
                &hub,
                Target::Connection(&connection),
                &params,
                &headers,
                body,
            )
            .await
        }
        _ => Err(ApiError::NotFound(format!(
            "No connection action {action:?}"
        ))),
    }
}

/// `DELETE …/connections/{connection}/groups`: 204.
pub(super) async fn remove_from_all_groups(
    State(state): State<WebPubSub>,
    Path((hub, connection)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    checked(&hub, &connection, query.as_deref())?;
    let hub = state.hub(&hub);
    if !hub.has_connection(&connection) {
        hub.broadcast_written(&Operation::Leave {
            hub: hub.name().to_owned(),
            to: To::Connection(connection.clone()),
            group: None,
        })
        .await?;
    }
    hub.remove_connection_from_all_groups(&connection);
    Ok(StatusCode::NO_CONTENT)
}

fn permission_args(
    hub: &str,
    permission: &str,
    connection: &str,
    query: Option<&str>,
) -> ApiResult<(Permission, Option<String>)> {
    let params = checked(hub, connection, query)?;
    let permission = Permission::parse(permission).ok_or_else(|| {
        ApiError::BadRequest(format!(
            "Unknown permission {permission:?}; use joinLeaveGroup or sendToGroup"
        ))
    })?;
    let target = params.get("targetName").map(str::to_owned);
    if let Some(group) = &target {
        check_group(group)?;
    }
    Ok((permission, target))
}

/// `PUT …/permissions/{permission}/connections/{connection}`: 200, 404 if no connection.
pub(super) async fn grant(
    State(state): State<WebPubSub>,
    Path((hub, permission, connection)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    let (permission, target) = permission_args(&hub, &permission, &connection, query.as_deref())?;
    let hub = state.hub(&hub);
    let missing = || ApiError::NotFound(format!("Connection '{connection}' does not exist"));
    if !hub.has_connection(&connection) && hub.cluster().is_some() {
        if !hub
            .exists_anywhere(
                Question::Connection {
                    id: connection.clone(),
                },
                false,
            )
            .await?
        {
            return Err(missing());
        }
        hub.broadcast_written(&Operation::permission(
            &hub,
            &connection,
            permission,
            target,
            true,
        ))
        .await?;
        return Ok(StatusCode::OK);
    }
    hub.grant_permission(&connection, permission, target.as_deref())
        .map_err(|_| missing())?;
    Ok(StatusCode::OK)
}

/// `DELETE …/permissions/{permission}/connections/{connection}`: 204.
pub(super) async fn revoke(
    State(state): State<WebPubSub>,
    Path((hub, permission, connection)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    let (permission, target) = permission_args(&hub, &permission, &connection, query.as_deref())?;
    let hub = state.hub(&hub);
    if !hub.has_connection(&connection) {
        let revoke = Operation::permission(&hub, &connection, permission, target.clone(), false);
        hub.broadcast_written(&revoke).await?;
    }
    hub.revoke_permission(&connection, permission, target.as_deref());
    Ok(StatusCode::NO_CONTENT)
}

/// `HEAD …/permissions/{permission}/connections/{connection}`: 200 or 404.
pub(super) async fn check(
    State(state): State<WebPubSub>,
    Path((hub, permission, connection)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    let (permission, target) = permission_args(&hub, &permission, &connection, query.as_deref())?;
    let hub = state.hub(&hub);
    let allowed = hub
        .check_permission_anywhere(&connection, permission, target.as_deref())
        .await?;
    Ok(found(allowed))
}
