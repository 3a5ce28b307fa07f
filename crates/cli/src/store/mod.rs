//! A state store client over [`crate::client::Client`]: one request at a time, each a
//! QoS 1 PUBLISH with the properties the SDKs send, its response matched by
//! Correlation Data on this client's response topic.

pub mod proto;

use bytes::Bytes;
use statehub_mqtt_codec::{ByteString, Publish, PublishProperties, QoS, UserProperties};

use crate::client::Client;
use crate::error::{CliError, ClientError};
use proto::{Hlc, Notification, Request, Response};

/// The answer to one request.
#[derive(Debug)]
pub struct Reply {
    pub response: Response,
    /// `__ts`: the key's version (SET, GET) when the store sent one.
    pub version: Option<String>,
}

/// A change to an observed key.
#[derive(Debug)]
pub struct Change {
    pub key: Vec<u8>,
    pub notification: Notification,
    pub version: Option<String>,
}

/// The connection, used for state store requests.
#[derive(Debug)]
pub struct StoreClient {
    mqtt: Client,
    response_topic: String,
    next_request: u64,
    notifications_subscribed: bool,
}

impl StoreClient {
    /// Subscribes to this client's response topic.
    pub async fn open(mut mqtt: Client) -> Result<StoreClient, ClientError> {
        let response_topic = proto::response_topic(mqtt.client_id());
        mqtt.subscribe(&[(response_topic.clone(), QoS::AtLeastOnce)])
            .await?;
        Ok(StoreClient {
            mqtt,
            response_topic,
            next_request: 0,
            notifications_subscribed: false,
        })
    }

    /// Sends one request and waits (the connection's timeout) for its response.
    pub async fn call(
        &mut self,
        request: &Request<'_>,
        fencing_token: Option<&Hlc>,
        timeout: std::time::Duration,
    ) -> Result<Reply, CliError> {
        self.next_request += 1;
        let correlation = correlation_data(self.next_request);
        let publish = self.request(request, fencing_token, &correlation, timeout);
        self.mqtt.publish(publish).await?;
        let topic = self.response_topic.clone();
        let response = tokio::time::timeout(
            timeout,
            self.mqtt.recv_where(|p| {
                *p.topic == *topic && p.properties.correlation_data.as_ref() == Some(&correlation)
            }),
        )
        .await
        .map_err(|_| ClientError::Timeout("waiting for the state store's response"))??;
        reply(&response)
    }

    fn request(
        &self,
        request: &Request<'_>,
        fencing_token: Option<&Hlc>,
        correlation: &Bytes,
        timeout: std::time::Duration,
    ) -> Publish {
        let id = self.mqtt.client_id();
        let mut user_properties: UserProperties = vec![
            (bs(proto::SOURCE_ID), bs(id)),
            (bs(proto::TIMESTAMP), bs(&Hlc::now(id).to_string())),
            (bs(proto::PROTOCOL_VERSION), bs(proto::VERSION_1_0)),
        ];
        if let Some(token) = fencing_token {
            user_properties.push((bs(proto::FENCING_TOKEN), bs(&token.to_string())));
        }
        let expiry = u32::try_from(timeout.as_secs().max(1)).unwrap_or(u32::MAX);
        Publish {
            qos: QoS::AtLeastOnce,
            topic: bs(proto::REQUEST_TOPIC),
            payload: request.encode(),
            properties: PublishProperties {
                message_expiry_interval: Some(expiry),
                response_topic: Some(bs(&self.response_topic)),
                correlation_data: Some(correlation.clone()),
                content_type: Some(bs(proto::CONTENT_TYPE)),
                user_properties,
                ..PublishProperties::default()
            },
            ..Publish::default()
        }
    }

    /// Subscribes to this client's notification topics (the store delivers
    /// notifications to the observing client whether or not it subscribed; the
    /// subscription says so to any other broker).
    pub async fn subscribe_notifications(&mut self) -> Result<(), ClientError> {
        if !self.notifications_subscribed {
            let filter = proto::notify_filter(self.mqtt.client_id());
            self.mqtt.subscribe(&[(filter, QoS::AtLeastOnce)]).await?;
            self.notifications_subscribed = true;
        }
        Ok(())
    }

    /// The next notification for a key this client observes.
    pub async fn next_change(&mut self) -> Result<Change, CliError> {
        let p = self
            .mqtt
            .recv_where(|p| proto::notified_key(&p.topic).is_some())
            .await?;
        let key = proto::notified_key(&p.topic).unwrap_or_default();
        let notification = Notification::parse(&p.payload)
            .map_err(|e| CliError::BadResponse(format!("notification: {e}")))?;
        Ok(Change {
            key,
            notification,
            version: user_property(&p.properties, proto::TIMESTAMP).map(str::to_owned),
        })
    }

    pub async fn close(self) {
        self.mqtt.disconnect().await;
    }
}

/// 16 bytes, as the SDKs send: the process id, then the request's number.
fn correlation_data(n: u64) -> Bytes {
    let mut data = Vec::with_capacity(16);
    data.extend_from_slice(&u64::from(std::process::id()).to_be_bytes());
    data.extend_from_slice(&n.to_be_bytes());
    Bytes::from(data)
}

fn reply(p: &Publish) -> Result<Reply, CliError> {
    match user_property(&p.properties, proto::STATUS) {
        Some("200") => {}
        status => {
            let message = user_property(&p.properties, proto::STATUS_MESSAGE).unwrap_or("");
            return Err(CliError::Store(format!(
                "status {} {message}",
                status.unwrap_or("missing")
            )));
        }
    }
    let response = Response::parse(&p.payload).map_err(|e| CliError::BadResponse(e.to_string()))?;
    Ok(Reply {
        response,
        version: user_property(&p.properties, proto::TIMESTAMP).map(str::to_owned),
    })
}

fn user_property<'a>(props: &'a PublishProperties, name: &str) -> Option<&'a str> {
    props
        .user_properties
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| &**v)
}

fn bs(s: &str) -> ByteString {
    ByteString::from(s)
}
