//! CONNECT handling: validate, authenticate, find or create the session (taking
//! it over from an older connection if need be) and build the CONNACK.

use std::sync::Arc;
use std::time::Duration;

use statehub_mqtt_codec::{
    validate, Auth, ByteString, ConnAck, ConnAckProperties, Connect, Packet, ProtocolVersion,
    ReasonCode,
};

use crate::auth::AuthDecision;
use crate::session::{Attachment, Session, SessionState};
use crate::session_store::Persist;
use crate::signal::Signal;
use crate::topic;
use crate::Broker;

/// The negotiated parameters of an accepted connection.
#[derive(Debug)]
pub(crate) struct Accepted {
    pub session: Arc<Session>,
    pub generation: u64,
    pub signal: Arc<Signal>,
    pub connack: ConnAck,
    pub keep_alive: Duration,
    pub session_expiry: u32,
    /// The session was recorded in the session store: the CONNACK waits for it.
    pub stored: bool,
}

/// A CONNECT that cannot be accepted: answer with this CONNACK code and close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused(pub ReasonCode);

/// What the first round of authentication asked for.
#[derive(Debug)]
pub(crate) enum AuthStep {
    Done(Option<bytes::Bytes>),
    Challenge(Packet),
}

/// Runs the authenticator on CONNECT.
pub(crate) fn authenticate(broker: &Broker, connect: &Connect) -> Result<AuthStep, Refused> {
    let auth = broker.inner.authenticator.read().clone();
    match auth.connect(connect) {
        AuthDecision::Success { data } => Ok(AuthStep::Done(data)),
        AuthDecision::Continue { data } if connect.protocol == ProtocolVersion::V5 => {
            Ok(AuthStep::Challenge(Packet::Auth(Auth {
                reason_code: ReasonCode::CONTINUE_AUTHENTICATION,
                authentication_method: connect.properties.authentication_method.clone(),
                authentication_data: data,
                ..Default::default()
            })))
        }
        AuthDecision::Continue { .. } => Err(Refused(ReasonCode::BAD_AUTHENTICATION_METHOD)),
        AuthDecision::Deny(code) => Err(Refused(code)),
    }
}

/// Checks the CONNECT's own fields.
pub(crate) fn check(broker: &Broker, connect: &Connect) -> Result<(), Refused> {
    if connect.client_id.is_empty()
        && !connect.clean_start
        && connect.protocol == ProtocolVersion::V311
    {
        return Err(Refused(ReasonCode::CLIENT_IDENTIFIER_NOT_VALID));
    }
    if let Some(w) = &connect.will {
        if validate::topic_name(&w.topic).is_err()
            || topic::too_deep(&w.topic, broker.config().max_topic_levels)
        {
            return Err(Refused(ReasonCode::TOPIC_NAME_INVALID));
        }
        if w.properties
            .response_topic
            .as_deref()
            .is_some_and(|t| validate::topic_name(t).is_err())
        {
            return Err(Refused(ReasonCode::PROTOCOL_ERROR));
        }
        if w.properties.payload_format_utf8 && std::str::from_utf8(&w.payload).is_err() {
            return Err(Refused(ReasonCode::PAYLOAD_FORMAT_INVALID));
        }
    }
    Ok(())
}

/// Attaches the connection to its session and builds the CONNACK.
pub(crate) fn accept(
    broker: &Broker,
    connect: &mut Connect,
    auth_data: Option<bytes::Bytes>,
) -> Accepted {
    let cfg = broker.config();
    let mut props = ConnAckProperties::default();
    if connect.client_id.is_empty() {
        let id: ByteString = format!("statehub-{:016x}", rand::random::<u64>()).into();
        props.assigned_client_identifier = Some(id.clone());
        connect.client_id = id;
    }
    let requested_expiry = match connect.protocol {
        ProtocolVersion::V5 => connect.properties.session_expiry_interval.unwrap_or(0),
        ProtocolVersion::V311 if connect.clean_start => 0,
        ProtocolVersion::V311 => u32::MAX,
    };
    let session_expiry = requested_expiry.min(cfg.max_session_expiry);
    if session_expiry != requested_expiry && connect.protocol == ProtocolVersion::V5 {
        props.session_expiry_interval = Some(session_expiry);
    }

    let mut keep_alive = connect.keep_alive;
    if cfg.max_keep_alive > 0
        && (keep_alive > cfg.max_keep_alive || (keep_alive == 0 && !cfg.keep_alive_zero_allowed))
    {
        keep_alive = cfg.max_keep_alive;
        props.server_keep_alive = Some(keep_alive);
    }

    let generation = broker.next_generation();
    let signal = Arc::new(Signal::default());
    let (session, session_present) = take_session(broker, connect, session_expiry);
    let stored = {
        let mut st = session.state.lock();
        st.expiry_interval = session_expiry;
        st.last_generation = generation;
        st.attached = Some(Attachment {
            generation,
            signal: signal.clone(),
        });
        persist(broker, &session, &mut st, session_expiry)
    };
    session.set_connected(true);

    props.receive_maximum = Some(cfg.receive_maximum);
    props.maximum_packet_size = Some(cfg.max_packet_size);
    props.topic_alias_maximum = Some(cfg.topic_alias_maximum);
    props.retain_available = Some(true);
    props.wildcard_subscription_available = Some(true);
    props.subscription_identifiers_available = Some(true);
    props.shared_subscription_available = Some(true);
    if connect.properties.request_response_information == Some(true) {
        props.response_information =
            Some(format!("statehub/responses/{}", connect.client_id).into());
    }
    if let Some(method) = &connect.properties.authentication_method {
        props.authentication_method = Some(method.clone());
        props.authentication_data = auth_data;
    }
    Accepted {
        session,
        generation,
        signal,
        connack: ConnAck {
            session_present,
            reason_code: ReasonCode::SUCCESS,
            properties: props,
        },
        keep_alive: Duration::from_secs(u64::from(keep_alive)),
        session_expiry,
        stored,
    }
}

/// Makes the session persistent if it should be (expiry above 0 and a session store),
/// or forgets its stored form if it no longer should be. True if a change was recorded
/// that the CONNACK must wait for.
fn persist(broker: &Broker, session: &Session, st: &mut SessionState, expiry: u32) -> bool {
    let Some(store) = broker.session_store() else {
        return false;
    };
    if expiry == 0 {
        // It ends with this connection: nothing of it needs to survive a restart.
        st.unpersist();
        return false;
    }
    if st.persist.is_none() {
        st.persist = Some(Persist {
            store,
            incarnation: rand::random::<u64>(),
        });
    }
    st.save(session.client_id(), false);
    true
}

/// Finds the client's session (resuming it unless Clean Start) or makes a new one.
/// An older connection on the same client id is told to go with 0x8E.
fn take_session(broker: &Broker, connect: &Connect, expiry: u32) -> (Arc<Session>, bool) {
    let sessions = &broker.inner.sessions;
    let existing = sessions.get(&connect.client_id).map(|s| s.clone());
    if let Some(old) = existing {
        let kicked = old.state.lock().attached.take();
        if let Some(a) = kicked {
            a.signal.close(ReasonCode::SESSION_TAKEN_OVER);
            // The old connection's teardown no longer owns the session and stays
            // quiet; services hear of its end now, before the new one can act.
            broker.notify_services_closed(&connect.client_id);
        }
        old.set_connected(false);
        if !connect.clean_start {
            return (old, true);
        }
        broker.end_session(&old);
    }
    let session = Arc::new(Session::new(connect.client_id.clone(), expiry));
    sessions.insert(connect.client_id.clone(), session.clone());
    (session, false)
}
