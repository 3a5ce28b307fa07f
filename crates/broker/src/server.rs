//! The MQTT listener: accepts TCP connections and spawns one task per connection.
//! On shutdown it stops accepting, every connection sends DISCONNECT 0x8B, and the
//! listener waits (bounded) for the connections to finish.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::connection;
use crate::Broker;

/// A bound MQTT listener.
#[derive(Debug)]
pub struct MqttListener {
    listener: TcpListener,
    broker: Broker,
}

impl MqttListener {
    /// Binds `addr` (port 0 picks a free port; see [`MqttListener::local_addr`]).
    pub async fn bind(broker: Broker, addr: SocketAddr) -> std::io::Result<MqttListener> {
        let listener = TcpListener::bind(addr).await?;
        Ok(MqttListener { listener, broker })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts connections until the broker's shutdown token is cancelled, then
    /// waits up to `drain` for open connections to close.
    pub async fn serve(self, drain: Duration) {
        let shutdown = self.broker.shutdown_token();
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        tokio::spawn(connection::serve(self.broker.clone(), stream, peer));
                    }
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        drop(self.listener);
        let deadline = tokio::time::Instant::now() + drain;
        while self.broker.connection_count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
