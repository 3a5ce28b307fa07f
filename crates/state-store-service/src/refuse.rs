//! Requests refused before the store sees them.

use std::time::Instant;

use statehub_broker::codec::{Publish, PublishProperties, QoS, ReasonCode};
use statehub_broker::{Broker, ClientInfo, LogLimit};

use crate::rpc;

/// Why a request is answered before the store sees it ([`screen`]).
pub(crate) enum Screened {
    /// No Response Topic: nowhere to answer, ignored.
    NoResponseTopic,
    /// QoS 0 or a reserved Response Topic ([`refused_up_front`]).
    UpFront,
    /// The RPC checks failed ([`rpc::check`]).
    Fault(rpc::Fault),
}

/// The checks every request passes before the store sees it, in order, whichever way
/// it is then run (alone, or begun in a run: `batch.rs`): its Response Topic and the
/// user properties the store reads, or why it is answered without the store.
pub(crate) fn screen(publish: &Publish) -> Result<(&str, rpc::RequestProps<'_>), Screened> {
    let props = &publish.properties;
    let topic = props
        .response_topic
        .as_deref()
        .ok_or(Screened::NoResponseTopic)?;
    if publish.qos == QoS::AtMostOnce || rpc::is_forbidden_response_topic(topic) {
        return Err(Screened::UpFront);
    }
    let request = rpc::RequestProps::of(props);
    rpc::check(props, &request).map_err(Screened::Fault)?;
    Ok((topic, request))
}

/// Answers a request [`screen`] turned away.
pub(crate) fn answer(broker: &Broker, from: &ClientInfo, publish: &Publish, why: Screened) {
    let props = &publish.properties;
    let client_id = &*from.client_id;
    let topic = props.response_topic.as_deref().unwrap_or_default();
    match why {
        Screened::NoResponseTopic => {
            tracing::debug!(
                client = client_id,
                "state store request without Response Topic ignored"
            );
        }
        Screened::UpFront => {
            refused_up_front(broker, client_id, publish.qos, props, topic);
        }
        Screened::Fault(fault) => {
            let correlation = props
                .correlation_data
                .as_deref()
                .map(bytes::Bytes::copy_from_slice);
            let deadline = rpc::deadline(props, broker.now());
            let fault = rpc::fault_response(topic.into(), correlation, &fault, deadline);
            broker.publish(fault.for_client(from.client_id.clone()));
        }
    }
}

/// Answers what is refused before the store sees it: a request at QoS 0 (an error reply
/// saying QoS 1 is required) and a reserved Response Topic (the client is
/// disconnected). `true` when the request was refused so.
pub(crate) fn refused_up_front(
    broker: &Broker,
    client_id: &str,
    qos: QoS,
    props: &PublishProperties,
    response_topic: &str,
) -> bool {
    if qos == QoS::AtMostOnce && !rpc::is_forbidden_response_topic(response_topic) {
        // Any client can send this as often as it likes: one line a minute.
        static LOG: LogLimit = LogLimit::per_secs(60);
        if let Some(left_out) = LOG.allow() {
            tracing::info!(
                client = client_id,
                left_out,
                "state store request at QoS 0 refused: QoS 1 is required"
            );
        }
        let correlation = props.correlation_data.clone();
        let deadline = rpc::deadline(props, Instant::now());
        broker.publish(rpc::qos0_response(
            response_topic.into(),
            correlation,
            deadline,
        ));
        return true;
    }
    if rpc::is_forbidden_response_topic(response_topic) {
        // Any client can send this as often as it likes: one line a minute.
        static LOG: LogLimit = LogLimit::per_secs(60);
        match LOG.allow() {
            Some(left_out) => tracing::info!(
                client = client_id,
                left_out,
                "reserved Response Topic; disconnecting"
            ),
            None => {
                tracing::debug!(client = client_id, "reserved Response Topic; disconnecting")
            }
        }
        broker.disconnect_client(client_id, ReasonCode::PROTOCOL_ERROR);
        return true;
    }
    false
}

/// Answers a request the store had no room to queue (`offload.rs`, already counted and
/// logged): `__stat=503`, busy, unless it is refused up front anyway.
pub(crate) fn busy(broker: &Broker, from: &ClientInfo, publish: &Publish) {
    let props = &publish.properties;
    let Some(response_topic) = props.response_topic.as_deref() else {
        return;
    };
    if refused_up_front(broker, &from.client_id, publish.qos, props, response_topic) {
        return;
    }
    let correlation = props
        .correlation_data
        .as_deref()
        .map(bytes::Bytes::copy_from_slice);
    let deadline = rpc::deadline(props, broker.now());
    let fault = rpc::fault_response(
        response_topic.into(),
        correlation,
        &rpc::Fault::busy(),
        deadline,
    );
    broker.publish(fault.for_client(from.client_id.clone()));
}
