//! `/api/hubs/{hub}/users/{user}…`: existence, `:send`, `:closeConnections`, and the
//! user's group memberships. Adding a user to a group adds the user's current
//! connections (404 when there are none, as the service answers); later connections of
//! the user are not added.

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};

use super::targets::{close, send};
use super::{check_group, check_id, found, hub_params, ApiError, ApiResult, Params};
use crate::hub::admin::{JoinError, Target};
use crate::WebPubSub;

fn checked(hub: &str, user: &str, query: Option<&str>) -> ApiResult<Params> {
    let params = hub_params(hub, query)?;
    check_id("user id", user)?;
    Ok(params)
}

/// `HEAD …/users/{user}`: 200 when the user has connections, else 404.
pub(super) async fn exists(
    State(state): State<WebPubSub>,
    Path((hub, user)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    checked(&hub, &user, query.as_deref())?;
    Ok(found(state.hub(&hub).has_user(&user)))
}

/// `POST …/users/{user}/:send` and `…/:closeConnections`.
pub(super) async fn action(
    State(state): State<WebPubSub>,
    Path((hub, user, action)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let params = checked(&hub, &user, query.as_deref())?;
    match action.as_str() {
        ":send" => send(&state, &hub, Target::User(&user), &params, &headers, body).await,
        ":closeConnections" => Ok(close(&state, &hub, Target::User(&user), &params)),
        _ => Err(ApiError::NotFound(format!("No user action {action:?}"))),
    }
}

/// `DELETE …/users/{user}/groups`: 204.
pub(super) async fn remove_from_all_groups(
    State(state): State<WebPubSub>,
    Path((hub, user)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    checked(&hub, &user, query.as_deref())?;
    state.hub(&hub).remove_user_from_all_groups(&user);
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT …/users/{user}/groups/{group}`: 200, or 404 for a user with no connection.
pub(super) async fn add_to_group(
    State(state): State<WebPubSub>,
    Path((hub, user, group)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    checked(&hub, &user, query.as_deref())?;
    check_group(&group)?;
    state
        .hub(&hub)
        .add_user_to_group(&user, &group)
        .map_err(|e| match e {
            JoinError::NotFound(_) => {
                ApiError::NotFound(format!("User '{user}' has no connection"))
            }
            JoinError::TooManyGroups(e) => {
                ApiError::BadRequest(format!("A connection of user '{user}': {e}"))
            }
        })?;
    Ok(StatusCode::OK)
}

/// `DELETE …/users/{user}/groups/{group}`: 204.
pub(super) async fn remove_from_group(
    State(state): State<WebPubSub>,
    Path((hub, user, group)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    checked(&hub, &user, query.as_deref())?;
    check_group(&group)?;
    state.hub(&hub).remove_user_from_group(&user, &group);
    Ok(StatusCode::NO_CONTENT)
}
