//! The data-plane REST API of api-version 2024-12-01 under `/api/hubs/{hub}` and
//! `/api/health`, as the server SDKs (`@azure/web-pubsub`, `azure-messaging-
//! webpubsubservice`) call it: the same paths, methods, parameters and status codes
//! (sends 202; adds and grants 200; removals, revokes and closes 204; existence checks
//! 200/404), errors as `{code, message}` with an `x-ms-error-code` header.
//!
//! One module per resource: `hubs` (hub-wide actions), `groups`, `users`,
//! `connections` (connections and permissions), `token` (`:generateToken`, health), and
//! `targets` for what sends and closes share. Every hub
//! route passes `auth` first: a bearer JWT signed with an access key whose audience is
//! the request URL.
//!
//! axum refuses route segments that start with `:`, so the `:action` segments are
//! captured as `{action}` and matched by each resource's handler.

pub(crate) mod auth;
mod connections;
mod groups;
mod hubs;
mod targets;
mod token;
mod users;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, head, post};
use axum::Router;
use serde::Serialize;

use crate::cluster::ClusterError;
use crate::filter::{Filter, FilterError};
use crate::WebPubSub;

/// A refused request, in the service's error form.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// 400: a parameter, the body or the filter is invalid.
    #[error("{0}")]
    BadRequest(String),
    /// 400: the OData filter does not parse.
    #[error(transparent)]
    Filter(#[from] FilterError),
    /// 401: no valid bearer token for this URL.
    #[error("{0}")]
    Unauthorized(String),
    /// 404: the connection, user or route does not exist.
    #[error("{0}")]
    NotFound(String),
    /// 413: the message is larger than the limit.
    #[error("The message is larger than {0} bytes")]
    TooLarge(usize),
    /// 415: a send with a content type other than JSON, text or bytes.
    #[error("Unsupported content type {0:?}; use application/json, text/plain or application/octet-stream")]
    UnsupportedMediaType(String),
    /// 503: the other nodes cannot be reached (nothing was done).
    #[error(transparent)]
    Unavailable(#[from] ClusterError),
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    message: String,
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest(_) | Self::Filter(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "Unauthorized"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "NotFound"),
            Self::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "PayloadTooLarge"),
            Self::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "UnsupportedMediaType")
            }
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
        }
    }
}

/// Errors carry a JSON body `{code, message}` but, as the service sends them, a
/// `text/plain` content type: the JS SDK then keeps the whole JSON text as the
/// `RestError` message, which its tests parse (`JSON.parse(error.message).message`).
/// A 401 is the exception, `application/json`: it is what a person with curl and a
/// wrong key meets first, and the SDKs read no message out of it.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let content_type = if status == StatusCode::UNAUTHORIZED {
            "application/json"
        } else {
            "text/plain; charset=utf-8"
        };
        let body = ErrorBody {
            code,
            message: self.to_string(),
        };
        let text = serde_json::to_string(&body).unwrap_or_default();
        (
            status,
            [
                ("x-ms-error-code", HeaderValue::from_static(code)),
                (
                    header::CONTENT_TYPE.as_str(),
                    HeaderValue::from_static(content_type),
                ),
            ],
            text,
        )
            .into_response()
    }
}

/// The result of a handler.
pub(crate) type ApiResult<T = StatusCode> = Result<T, ApiError>;

/// The query string as name/value pairs, names compared case-insensitively (the SDKs
/// send `maxpagesize`, documents say `maxPageSize`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    /// Parses a raw query string (`None` is empty).
    pub(crate) fn parse(query: Option<&str>) -> Self {
        Self(
            query
                .map(|q| serde_urlencoded::from_str(q).unwrap_or_default())
                .unwrap_or_default(),
        )
    }

    /// The first value of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a repeated parameter (`excluded`, `role`, `group`).
    pub(crate) fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// An optional integer within `min..=max`.
    pub(crate) fn int(&self, name: &str, min: i64, max: i64) -> ApiResult<Option<i64>> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        match v.trim().parse::<i64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(ApiError::BadRequest(format!(
                "The value of '{name}' must be an integer from {min} to {max}, not {v:?}"
            ))),
        }
    }

    /// The `filter` parameter, parsed.
    pub(crate) fn filter(&self) -> ApiResult<Option<Filter>> {
        optional_filter(self.get("filter"))
    }

    /// Checks that `api-version` is present (every version is served the same way).
    pub(crate) fn require_api_version(&self) -> ApiResult<()> {
        match self.get("api-version") {
            Some(v) if !v.is_empty() => Ok(()),
            _ => Err(ApiError::BadRequest(
                "The 'api-version' query parameter is required".into(),
            )),
        }
    }
}

/// Parses an optional filter; an empty one is none.
pub(crate) fn optional_filter(text: Option<&str>) -> ApiResult<Option<Filter>> {
    match text.map(str::trim) {
        None | Some("") => Ok(None),
        Some(f) => Ok(Some(Filter::parse(f)?)),
    }
}

/// The query of a hub route, after checking the hub name and `api-version`.
pub(crate) fn hub_params(hub: &str, query: Option<&str>) -> ApiResult<Params> {
    check_hub(hub)?;
    let params = Params::parse(query);
    params.require_api_version()?;
    Ok(params)
}

/// An existence check's answer: 200 or 404.
pub(crate) fn found(exists: bool) -> StatusCode {
    if exists {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    }
}

/// Hub names, as the REST API's pattern `^[A-Za-z][A-Za-z0-9_`,.[\]]{0,127}$`.
pub(crate) fn check_hub(name: &str) -> ApiResult<()> {
    if crate::protocol::valid_hub_name(name) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "Invalid hub name {name:?}: it must start with a letter and hold at most 128 letters, digits and _`,.[]"
        )))
    }
}

/// Group names: 1 to 1024 characters, not only whitespace.
pub(crate) fn check_group(name: &str) -> ApiResult<()> {
    let len = name.chars().count();
    if (1..=1024).contains(&len) && !name.chars().all(char::is_whitespace) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "Invalid group name {name:?}: it must be 1 to 1024 characters and not only whitespace"
        )))
    }
}

/// User and connection ids: not empty.
pub(crate) fn check_id(what: &str, id: &str) -> ApiResult<()> {
    if id.is_empty() {
        Err(ApiError::BadRequest(format!(
            "The {what} must not be empty"
        )))
    } else {
        Ok(())
    }
}

/// `scheme://host` of this request as the client reached it (`X-Forwarded-*` honoured),
/// for URLs the API hands out (`nextLink`, token audiences).
pub(crate) fn origin(headers: &HeaderMap) -> String {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let scheme = get("x-forwarded-proto")
        .and_then(|p| p.split(',').next())
        .map(str::trim)
        .filter(|p| *p == "https" || *p == "http")
        .unwrap_or("http");
    let host = get("x-forwarded-host")
        .or_else(|| get(header::HOST.as_str()))
        .unwrap_or("localhost");
    format!("{scheme}://{host}")
}

async fn not_found() -> ApiError {
    ApiError::NotFound("No such REST API operation".into())
}

/// The REST routes. Hub routes require a bearer token; `/api/health` does not.
pub(crate) fn router(state: WebPubSub) -> Router {
    let hubs = Router::new()
        .route("/api/hubs/{hub}/{action}", post(hubs::action))
        .route(
            "/api/hubs/{hub}/connections/{connection}",
            head(connections::exists).delete(connections::close),
        )
        .route(
            "/api/hubs/{hub}/connections/{connection}/{action}",
            post(connections::action),
        )
        .route(
            "/api/hubs/{hub}/connections/{connection}/groups",
            axum::routing::delete(connections::remove_from_all_groups),
        )
        .route("/api/hubs/{hub}/groups/{group}", head(groups::exists))
        .route(
            "/api/hubs/{hub}/groups/{group}/{action}",
            post(groups::action),
        )
        .route(
            "/api/hubs/{hub}/groups/{group}/connections",
            get(groups::list),
        )
        .route(
            "/api/hubs/{hub}/groups/{group}/connections/{connection}",
            axum::routing::put(groups::add_connection).delete(groups::remove_connection),
        )
        .route(
            "/api/hubs/{hub}/permissions/{permission}/connections/{connection}",
            axum::routing::put(connections::grant)
                .delete(connections::revoke)
                .head(connections::check),
        )
        .route("/api/hubs/{hub}/users/{user}", head(users::exists))
        .route("/api/hubs/{hub}/users/{user}/{action}", post(users::action))
        .route(
            "/api/hubs/{hub}/users/{user}/groups",
            axum::routing::delete(users::remove_from_all_groups),
        )
        .route(
            "/api/hubs/{hub}/users/{user}/groups/{group}",
            axum::routing::put(users::add_to_group).delete(users::remove_from_group),
        )
        .route_layer(from_fn_with_state(state.clone(), auth::require_token));
    Router::new()
        .route("/api/health", get(token::health))
        .merge(hubs)
        .route("/api/{*rest}", axum::routing::any(not_found))
        .with_state(state)
}
