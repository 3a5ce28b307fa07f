//! `/api/hubs/{hub}/users/{user}…`: existence, `:send`, `:closeConnections`, and the
//! user's group memberships. Adding a user to a group adds the user's current
//! connections (404 when there are none, as the service answers); later connections of
//! the user are not added.

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};

use super::targets::{close, send};
use super::{check_group, check_id, found, hub_params, ApiError, ApiResult, Params};
use crate::cluster::{Operation, Question, To};
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
    let hub = state.hub(&hub);
    let here = hub.has_user(&user);
    let question = Question::User { id: user };
    Ok(found(hub.exists_anywhere(question, here).await?))
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
        ":closeConnections" => close(&state, &hub, Target::User(&user), &params).await,
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
    let hub = state.hub(&hub);
    hub.broadcast_written(&leave(&hub, &user, None)).await?;
    hub.remove_user_from_all_groups(&user);
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
    let hub = state.hub(&hub);
    match hub.add_user_to_group(&user, &group) {
        Ok(()) => {}
        Err(JoinError::TooManyGroups(e)) => {
            return Err(ApiError::BadRequest(format!(
                "A connection of user '{user}': {e}"
            )))
        }
        Err(JoinError::NotFound(_)) => {
            let question = Question::User { id: user.clone() };
            if !hub.exists_anywhere(question, false).await? {
                return Err(ApiError::NotFound(format!(
                    "User '{user}' has no connection"
                )));
            }
        }
    }
    // The user's connections on other nodes join there (as far as their limits allow).
    hub.broadcast_written(&Operation::Join {
        hub: hub.name().to_owned(),
        to: To::User(user.clone()),
        group,
    })
    .await?;
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
    let hub = state.hub(&hub);
    hub.broadcast_written(&leave(&hub, &user, Some(group.clone())))
        .await?;
    hub.remove_user_from_group(&user, &group);
    Ok(StatusCode::NO_CONTENT)
}

fn leave(hub: &crate::hub::Hub, user: &str, group: Option<String>) -> Operation {
    Operation::Leave {
        hub: hub.name().to_owned(),
        to: To::User(user.to_owned()),
        group,
    }
}
