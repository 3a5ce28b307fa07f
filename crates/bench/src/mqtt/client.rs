//! Connection setup and teardown for the `mqtt` scenario's clients: CONNECT
//! with the chosen protocol version, SUBSCRIBE with the SUBACK checks the
//! scenario needs, reading while waiting for a stop signal, and a best-effort
//! DISCONNECT.
//!
//! The wire-level handshake itself is shared with other scenarios in
//! [`crate::common`]; this module only adds what is specific to `mqtt`.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{self, check_granted, err_str, Conn, ReadHalf, WriteHalf};
use crate::proto::{self, Version};

pub(super) async fn connect(
    addr: SocketAddr,
    v: Version,
    client_id: &str,
    keep_alive: u16,
) -> Result<Conn, String> {
    let mut out = Vec::with_capacity(64);
    proto::encode_connect(&mut out, v, client_id, keep_alive);
    common::connect(addr, v, &out).await
}

/// Subscribes to `filters`; returns the lowest QoS granted.
pub(super) async fn subscribe(
    conn: &mut Conn,
    v: Version,
    filters: &[String],
    qos: u8,
) -> Result<u8, String> {
    let codes = common::subscribe(conn, v, filters, qos).await?;
    if codes.len() != filters.len() {
        return Err(format!(
            "SUBACK has {} codes for {} filters",
            codes.len(),
            filters.len()
        ));
    }
    check_granted(&codes)?;
    Ok(codes.iter().copied().min().unwrap_or(qos))
}

pub(super) async fn disconnect(mut wr: WriteHalf) {
    let mut out = Vec::with_capacity(2);
    proto::encode_disconnect(&mut out);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = wr.write_all(&out).await;
        let _ = wr.shutdown().await;
    })
    .await;
}

/// What [`read_or_stop`] saw.
#[derive(Debug)]
pub(super) enum Read {
    /// Bytes were appended to the buffer.
    Data,
    /// The broker closed the connection.
    Closed,
    /// Reading failed (the message says why).
    Failed(String),
    /// `stop` completed first.
    Stopped,
}

/// Reads more bytes into `buf`, unless `stop` completes first.
pub(super) async fn read_or_stop(rd: &mut ReadHalf, buf: &mut BytesMut, stop: impl Future) -> Read {
    tokio::select! {
        r = rd.read_buf(buf) => match r {
            Ok(0) => Read::Closed,
            Ok(_) => Read::Data,
            Err(e) => Read::Failed(err_str("read", e)),
        },
        _ = stop => Read::Stopped,
    }
}
