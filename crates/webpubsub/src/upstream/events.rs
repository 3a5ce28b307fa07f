//! A hub's upstream: the handlers of its settings bound to the shared [`Upstream`]
//! poster. It is the hub's [`Events`] (connected, disconnected, user events) and runs
//! the blocking `connect` event for the handshake.

use std::sync::Arc;

use super::cloudevents::{
    connect_response, system_body, user_event_body, user_event_response, ConnectRequest,
    ConnectResponse, EventContext, UpstreamError,
};
use super::Upstream;
use crate::config::hubs::{Event, HubSettings, SystemEvent};
use crate::hub::{Events, Hub, Session, UserEventFuture};
use crate::protocol::Payload;

/// A hub's handlers and the poster.
#[derive(Debug)]
pub(crate) struct HubEvents {
    upstream: Upstream,
    settings: HubSettings,
}

/// Who connects, for the `connect` event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Connecting<'a> {
    /// The hub.
    pub hub: &'a str,
    /// The connection id the session will have.
    pub connection_id: &'a str,
    /// The token's user id.
    pub user_id: Option<&'a str>,
}

impl HubEvents {
    /// Binds a hub's settings to the poster.
    pub(crate) fn new(upstream: Upstream, settings: HubSettings) -> Self {
        Self { upstream, settings }
    }

    /// Does a handler take the `connect` event?
    pub(crate) fn takes_connect(&self) -> bool {
        self.settings.takes(&Event::System(SystemEvent::Connect))
    }

    /// Runs the blocking `connect` event. `Ok(None)` when no handler takes it; otherwise
    /// the handler's changes and the connection state it set.
    pub(crate) async fn connect(
        &self,
        who: Connecting<'_>,
        request: &ConnectRequest,
    ) -> Result<Option<(ConnectResponse, Option<String>)>, UpstreamError> {
        let event = Event::System(SystemEvent::Connect);
        let Some(handler) = self.settings.handler(&event) else {
            return Ok(None);
        };
        let ctx = EventContext {
            hub: who.hub,
            connection_id: who.connection_id,
            user_id: who.user_id,
            subprotocol: None,
            connection_state: None,
            event,
        };
        let body = serde_json::to_vec(request)
            .map_err(|e| UpstreamError::Failed(format!("connect body: {e}")))?;
        let answer = self
            .upstream
            .post(
                &handler.url(who.hub, &event),
                self.upstream.event_headers(&ctx),
                "application/json; charset=utf-8",
                body,
            )
            .await?;
        let response = connect_response(answer.status, &answer.body)?;
        Ok(Some((response, answer.connection_state)))
    }

    fn fire(&self, hub: &Hub, session: &Session, event: SystemEvent, reason: Option<&str>) {
        let e = Event::System(event);
        let Some(handler) = self.settings.handler(&e) else {
            return;
        };
        let state = session.connection_state();
        let ctx = context(hub, session, state.as_deref(), e);
        let headers = self.upstream.event_headers(&ctx);
        let body = system_body(event, reason).to_string().into_bytes();
        self.upstream
            .fire(session.id(), handler.url(hub.name(), &e), headers, body);
    }
}

fn context<'a>(
    hub: &'a Hub,
    session: &'a Session,
    state: Option<&'a str>,
    event: Event<'a>,
) -> EventContext<'a> {
    EventContext {
        hub: hub.name(),
        connection_id: session.id(),
        user_id: session.user_id(),
        subprotocol: session.subprotocol(),
        connection_state: state,
        event,
    }
}

impl Events for HubEvents {
    fn connected(&self, hub: &Hub, session: &Arc<Session>) {
        self.fire(hub, session, SystemEvent::Connected, None);
    }

    fn disconnected(&self, hub: &Hub, session: &Arc<Session>, reason: &str) {
        self.fire(hub, session, SystemEvent::Disconnected, Some(reason));
    }

    fn takes_user_event(&self, event: &str) -> bool {
        self.settings.takes(&Event::User(event))
    }

    fn user_event(
        &self,
        hub: &Hub,
        session: &Arc<Session>,
        event: &str,
        payload: &Payload,
    ) -> UserEventFuture {
        let e = Event::User(event);
        let Some(handler) = self.settings.handler(&e) else {
            return Box::pin(async { Ok(None) });
        };
        let state = session.connection_state();
        let ctx = context(hub, session, state.as_deref(), e);
        let headers = self.upstream.event_headers(&ctx);
        let url = handler.url(hub.name(), &e);
        let (content_type, body) = user_event_body(payload);
        let upstream = self.upstream.clone();
        let session = Arc::clone(session);
        Box::pin(async move {
            let answer = upstream.post(&url, headers, content_type, body).await?;
            let reply =
                user_event_response(answer.status, answer.content_type.as_deref(), &answer.body)?;
            if let Some(state) = answer.connection_state {
                session.set_connection_state(state);
            }
            Ok(reply)
        })
    }
}
