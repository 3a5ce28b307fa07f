//! Thin wrappers around rumqttc 0.24 (MQTT 5 and 3.1.1): the event loop runs in a
//! task that forwards every incoming packet to a channel; every wait is bounded.

pub mod v5c {
    //! rumqttc's MQTT 5 client, its event loop driven by a task that forwards
    //! every incoming packet to a channel.
    use crate::*;
    pub use rumqttc::v5::mqttbytes::v5::{
        Filter, Packet as In, Publish as InPublish, PublishProperties,
    };
    pub use rumqttc::v5::mqttbytes::QoS;
    pub use rumqttc::v5::{AsyncClient, MqttOptions};
    use rumqttc::v5::{Event, Incoming};
    use tokio::sync::mpsc;

    pub fn options(addr: SocketAddr, id: &str) -> MqttOptions {
        let mut o = MqttOptions::new(id, addr.ip().to_string(), addr.port());
        o.set_keep_alive(Duration::from_secs(30));
        o
    }

    /// Starts the client and waits for its CONNACK.
    pub async fn connect(o: MqttOptions) -> (AsyncClient, mpsc::UnboundedReceiver<In>) {
        let (client, mut el) = AsyncClient::new(o, 100);
        let (tx, mut rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(p)) => {
                        if tx.send(p).is_err() {
                            return;
                        }
                    }
                    Ok(Event::Outgoing(_)) => {}
                    Err(_) => return,
                }
            }
        });
        match timeout(WAIT, rx.recv()).await {
            Ok(Some(Incoming::ConnAck(_))) => {}
            other => panic!("rumqttc v5: expected CONNACK, got {other:?}"),
        }
        (client, rx)
    }

    /// Next PUBLISH, skipping other packets.
    pub async fn next_publish(rx: &mut mpsc::UnboundedReceiver<In>) -> InPublish {
        let deadline = Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(In::Publish(p))) => return p,
                Ok(Some(_)) => {}
                other => panic!("rumqttc v5: expected PUBLISH, got {other:?}"),
            }
        }
    }

    /// Waits for the SUBACK of the latest subscribe.
    pub async fn next_suback(rx: &mut mpsc::UnboundedReceiver<In>) {
        let deadline = Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(In::SubAck(_))) => return,
                Ok(Some(_)) => {}
                other => panic!("rumqttc v5: expected SUBACK, got {other:?}"),
            }
        }
    }
}

pub mod v5pub {
    //! A publisher on rumqttc's MQTT 5 client that sees every PUBACK's reason code.
    use crate::*;
    use rumqttc::v5::mqttbytes::v5::Packet as In;
    pub use rumqttc::v5::mqttbytes::v5::PubAckReason;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, StateError};

    /// Publishes each of `payloads` on `topic` at QoS 1 as client `id`, one at a time,
    /// and returns each PUBACK's reason.
    pub async fn publish_each(
        addr: SocketAddr,
        id: &str,
        topic: &str,
        payloads: &[String],
    ) -> Vec<PubAckReason> {
        let mut o = MqttOptions::new(id, addr.ip().to_string(), addr.port());
        o.set_keep_alive(Duration::from_secs(30));
        let (client, mut el) = AsyncClient::new(o, 10);
        let mut reasons = Vec::new();
        for p in payloads {
            client
                .publish(topic, QoS::AtLeastOnce, false, p.clone())
                .await
                .expect("rumqttc request channel");
            reasons.push(next_puback(&mut el).await);
        }
        reasons
    }

    /// The reason of the next PUBACK. rumqttc reports an error reason as an event-loop
    /// error (and reconnects on the next poll).
    async fn next_puback(el: &mut EventLoop) -> PubAckReason {
        let wait = async {
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(In::PubAck(a))) => return a.reason,
                    Ok(_) => {}
                    Err(ConnectionError::MqttState(StateError::PubAckFail { reason })) => {
                        return reason
                    }
                    Err(e) => panic!("rumqttc v5 publisher: {e:?}"),
                }
            }
        };
        timeout(WAIT, wait).await.expect("PUBACK within WAIT")
    }
}

pub mod v4c {
    //! rumqttc's MQTT 3.1.1 client, same shape as [`super::v5c`].
    use crate::*;
    pub use rumqttc::{AsyncClient, MqttOptions, Packet as In, Publish as InPublish, QoS};
    use rumqttc::{Event, Incoming};
    use tokio::sync::mpsc;

    pub fn options(addr: SocketAddr, id: &str) -> MqttOptions {
        let mut o = MqttOptions::new(id, addr.ip().to_string(), addr.port());
        o.set_keep_alive(Duration::from_secs(30));
        o
    }

    pub async fn connect(o: MqttOptions) -> (AsyncClient, mpsc::UnboundedReceiver<In>) {
        let (client, mut el) = AsyncClient::new(o, 100);
        let (tx, mut rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(p)) => {
                        if tx.send(p).is_err() {
                            return;
                        }
                    }
                    Ok(Event::Outgoing(_)) => {}
                    Err(_) => return,
                }
            }
        });
        match timeout(WAIT, rx.recv()).await {
            Ok(Some(Incoming::ConnAck(_))) => {}
            other => panic!("rumqttc v4: expected CONNACK, got {other:?}"),
        }
        (client, rx)
    }

    pub async fn next_publish(rx: &mut mpsc::UnboundedReceiver<In>) -> InPublish {
        let deadline = Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(In::Publish(p))) => return p,
                Ok(Some(_)) => {}
                other => panic!("rumqttc v4: expected PUBLISH, got {other:?}"),
            }
        }
    }

    pub async fn next_suback(rx: &mut mpsc::UnboundedReceiver<In>) {
        let deadline = Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(In::SubAck(_))) => return,
                Ok(Some(_)) => {}
                other => panic!("rumqttc v4: expected SUBACK, got {other:?}"),
            }
        }
    }
}
