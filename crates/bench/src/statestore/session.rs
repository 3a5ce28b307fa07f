//! One `statestore` client's connection from start to end: CONNECT like the
//! SDK (clean start false, Session Expiry 3600) and SUBSCRIBE to the response
//! topic ([`connect`]), then the populate and measure phases in step with the
//! other clients, and a session-ending DISCONNECT ([`run_client`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Barrier;
use tokio::time::timeout_at;

use super::client::Client;
use super::phase::{run_phase, Phase, Rng};
use super::stats::OpStats;
use crate::common::{self, check_granted, Conn};
use crate::proto::{self, Version};

pub(super) async fn connect(addr: SocketAddr, c: &Client, keep_alive: u16) -> Result<Conn, String> {
    let mut out = Vec::with_capacity(64);
    proto::encode_connect_v5_session(&mut out, &c.id, keep_alive, false, 3600);
    let mut conn = common::connect(addr, Version::V5, &out).await?;
    // Like the SDK: SUBSCRIBE to the response topic once connected.
    let codes = common::subscribe(&mut conn, Version::V5, &[c.response_topic()], 1).await?;
    check_granted(&codes)?;
    Ok(conn)
}

pub(super) struct ClientResult {
    pub(super) populate: Option<OpStats>,
    pub(super) measure: Option<OpStats>,
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn run_client(
    mut conn: Conn,
    mut c: Client,
    populate: Option<Phase>,
    measure: Phase,
    (populated, go): (Arc<Barrier>, Arc<Barrier>),
    seed: u64,
) -> ClientResult {
    let mut rng = Rng(seed | 1);
    let mut res = ClientResult {
        populate: None,
        measure: None,
    };
    let mut alive = true;
    if let Some(ph) = &populate {
        let st = run_phase(&mut conn.stream, &mut conn.buf, &mut c, &mut rng, ph).await;
        alive = st.error.is_none();
        res.populate = Some(st);
    }
    populated.wait().await;
    go.wait().await;
    if alive {
        res.measure =
            Some(run_phase(&mut conn.stream, &mut conn.buf, &mut c, &mut rng, &measure).await);
        // Collect the PUBACKs still due, briefly, so they are not reported as missing
        // only because the run ended.
        let deadline = Instant::now() + Duration::from_millis(200);
        while c.pubacks_due > 0 {
            match timeout_at(deadline.into(), conn.stream.read_buf(&mut conn.buf)).await {
                Ok(Ok(n)) if n > 0 => {
                    let mut acks = Vec::new();
                    let mut scratch = OpStats::new();
                    if c.handle(&mut conn.buf, &mut acks, &mut scratch).is_err() {
                        break;
                    }
                    if let Some(m) = res.measure.as_mut() {
                        m.puback_failures += scratch.puback_failures;
                        m.unmatched += scratch.unmatched;
                    }
                    if !acks.is_empty() {
                        let _ = conn.stream.write_all(&acks).await;
                    }
                }
                _ => break,
            }
        }
    }
    let mut out = Vec::with_capacity(16);
    proto::encode_disconnect_v5_end_session(&mut out);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = conn.stream.write_all(&out).await;
        let _ = conn.stream.shutdown().await;
    })
    .await;
    res
}
