//! The admin API's overview, MQTT clients and Web PubSub routes.

use std::sync::atomic::Ordering;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use statehub_broker::codec::{ProtocolVersion, ReasonCode};
use statehub_broker::SessionSnapshot;
use statehub_webpubsub::ViewFrom;

use super::{Admin, ApiError};

/// Filters shown per client in a list (its `subscription_count` says how many).
const SUBSCRIPTIONS_SHOWN: usize = 50;

/// `GET /admin/api/overview`: uptime and the counters that exist; the page turns
/// successive counts into rates.
pub(super) async fn overview(State(admin): State<Admin>) -> Json<Value> {
    let broker = admin.broker();
    let m = broker.metrics();
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let (queued_messages, queued_bytes) = broker.queued_total();
    let wps = admin.wps().map(|wps| {
        let c = wps.counters();
        let (_, hubs) = wps.hubs(None, 0);
        json!({
            "hubs": hubs,
            "slow_consumers": c.slow_consumers,
            "replay_evictions": c.replay_evictions,
            "replay_lost_sessions": c.replay_lost_sessions,
        })
    });
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_secs": admin.uptime_secs(),
        "live_streams": admin.open_streams(),
        "tails_dropped": broker.taps_dropped(),
        "mqtt": {
            "connections": broker.connection_count(),
            "connections_total": load(&m.connections_total),
            "subscriptions": broker.subscription_count(),
            "persistent_sessions": broker.persistent_session_count(),
            "retained_messages": broker.retained_count(),
            "queued_messages": queued_messages,
            "queued_bytes": queued_bytes,
            "messages_in": load(&m.messages_in),
            "messages_out": load(&m.messages_out),
            "dropped": load(&m.dropped),
            "expired_dropped": load(&m.expired_dropped),
            "slow_consumers": load(&m.slow_consumers),
            "protocol_errors": load(&m.protocol_errors),
        },
        "webpubsub": wps,
    }))
}

#[derive(Debug, Deserialize)]
pub(super) struct PageQuery {
    after: Option<String>,
    limit: Option<usize>,
}

fn client_json(s: &SessionSnapshot) -> Value {
    let protocol = s.peer.map(|p| match p.protocol {
        ProtocolVersion::V5 => "5",
        ProtocolVersion::V311 => "3.1.1",
    });
    json!({
        "client_id": s.client_id,
        "connected": s.connected,
        "address": s.peer.map(|p| p.addr.to_string()),
        "protocol": protocol,
        "session_expiry_secs": s.expiry_interval,
        "persistent": s.persistent,
        "subscriptions": s.subscriptions.iter()
            .map(|(f, qos)| json!({"filter": f, "qos": qos}))
            .collect::<Vec<_>>(),
        "subscription_count": s.subscription_count,
        "queued": s.queued,
        "inflight": s.inflight,
    })
}

/// `GET /admin/api/clients?after=&limit=`: a page of sessions by client id.
pub(super) async fn clients(State(admin): State<Admin>, Query(q): Query<PageQuery>) -> Json<Value> {
    let limit = admin.page(q.limit);
    let page = admin
        .broker()
        .sessions_page(q.after.as_deref(), limit, SUBSCRIPTIONS_SHOWN);
    let next = page
        .more
        .then(|| page.sessions.last().map(|s| s.client_id.clone()))
        .flatten();
    Json(json!({
        "clients": page.sessions.iter().map(client_json).collect::<Vec<_>>(),
        "next_after": next,
    }))
}

#[derive(Debug, Deserialize)]
pub(super) struct DisconnectBody {
    client_id: String,
}

/// `POST /admin/api/clients/disconnect {"client_id"}`: closes the client's connection
/// with DISCONNECT 0x98 (Administrative action); its session stays as its expiry
/// says. 404 if the client is not connected.
pub(super) async fn disconnect(
    State(admin): State<Admin>,
    Json(body): Json<DisconnectBody>,
) -> Result<Json<Value>, ApiError> {
    if admin
        .broker()
        .disconnect_client(&body.client_id, ReasonCode::ADMINISTRATIVE_ACTION)
    {
        tracing::info!(
            client = body.client_id,
            "disconnected from the admin API (0x98)"
        );
        Ok(Json(json!({ "disconnected": body.client_id })))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("client {} is not connected", body.client_id),
        ))
    }
}

fn wps_of(admin: &Admin) -> Result<&statehub_webpubsub::WebPubSub, ApiError> {
    admin.wps().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "web pubsub is off: no access key configured (--access-key, \
             STATEHUB_ACCESS_KEYS or [webpubsub] access_keys)",
        )
    })
}

/// The `after` of the next page: the last name if the page is full.
fn next_after(names: &[&str], limit: usize) -> Option<String> {
    (names.len() == limit)
        .then(|| names.last().map(|n| n.to_string()))
        .flatten()
}

/// `GET /admin/api/wps/hubs?after=&limit=`: the hubs by name with their connection
/// counts.
pub(super) async fn hubs(
    State(admin): State<Admin>,
    Query(q): Query<PageQuery>,
) -> Result<Json<Value>, ApiError> {
    let wps = wps_of(&admin)?;
    let limit = admin.page(q.limit);
    let (hubs, total) = wps.hubs(q.after.as_deref(), limit);
    let names: Vec<&str> = hubs.iter().map(|h| h.name.as_str()).collect();
    Ok(Json(json!({
        "total": total,
        "next_after": next_after(&names, limit),
        "hubs": hubs.iter()
            .map(|h| json!({"name": h.name, "connections": h.connections}))
            .collect::<Vec<_>>(),
    })))
}

#[derive(Debug, Deserialize)]
pub(super) struct HubQuery {
    name: String,
    limit: Option<usize>,
    groups_after: Option<String>,
    connections_after: Option<String>,
}

/// `GET /admin/api/wps/hub?name=&limit=&groups_after=&connections_after=`: a page of
/// a hub's groups and one of its connections.
pub(super) async fn hub(
    State(admin): State<Admin>,
    Query(q): Query<HubQuery>,
) -> Result<Json<Value>, ApiError> {
    let wps = wps_of(&admin)?;
    let limit = admin.page(q.limit);
    let from = ViewFrom {
        groups_after: q.groups_after.as_deref(),
        connections_after: q.connections_after.as_deref(),
    };
    let view = wps
        .hub_view(&q.name, from, limit)
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no hub {}", q.name)))?;
    let groups: Vec<&str> = view.groups.iter().map(|g| g.name.as_str()).collect();
    let conns: Vec<&str> = view
        .connections
        .iter()
        .map(|c| c.connection_id.as_str())
        .collect();
    Ok(Json(json!({
        "groups_next_after": next_after(&groups, limit),
        "connections_next_after": next_after(&conns, limit),
        "name": view.name,
        "connection_count": view.connection_count,
        "group_count": view.group_count,
        "groups": view.groups.iter()
            .map(|g| json!({"name": g.name, "members": g.members}))
            .collect::<Vec<_>>(),
        "connections": view.connections.iter().map(|c| json!({
            "connection_id": c.connection_id,
            "user_id": c.user_id,
            "subprotocol": c.subprotocol,
            "groups": c.groups,
        })).collect::<Vec<_>>(),
    })))
}

#[derive(Debug, Deserialize)]
pub(super) struct SendBody {
    hub: String,
    group: String,
    text: String,
}

/// `POST /admin/api/wps/send {"hub","group","text"}`: a text message to a group.
pub(super) async fn send(
    State(admin): State<Admin>,
    Json(body): Json<SendBody>,
) -> Result<Json<Value>, ApiError> {
    let wps = wps_of(&admin)?;
    let reached = wps.send_text_to_group(&body.hub, &body.group, body.text);
    Ok(Json(json!({ "reached": reached })))
}
