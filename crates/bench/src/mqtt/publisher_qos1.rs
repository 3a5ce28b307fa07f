//! The QoS 1 publishing loop of the `mqtt` scenario: packet ids form the
//! in-flight window (`--inflight`, capped by the broker's Receive Maximum), a
//! separate task reads PUBACKs, frees their ids and measures publish-to-PUBACK
//! latency ([`AckStats`]), and the publisher drains outstanding PUBACKs at the end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use hdrhistogram::Histogram;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::timeout_at;

use super::client::{disconnect, read_or_stop, Read};
use super::publisher::{PubPlan, PubStats};
use super::MAX_BATCH_BYTES;
use crate::common::{err_str, for_each_packet, now_ns, ReadHalf, WriteHalf};
use crate::proto::{self, Version};
use crate::report::new_histogram;

struct AckStats {
    acked: u64,
    failures: u64,
    last_ack_ns: u64,
    hist: Histogram<u64>,
    error: Option<String>,
}

async fn read_acks(
    mut rd: ReadHalf,
    mut buf: BytesMut,
    v: Version,
    sent_at: Arc<Vec<AtomicU64>>,
    ids: mpsc::UnboundedSender<u16>,
    mut stop: oneshot::Receiver<()>,
) -> AckStats {
    let mut st = AckStats {
        acked: 0,
        failures: 0,
        last_ack_ns: 0,
        hist: new_histogram(),
        error: None,
    };
    loop {
        let r = for_each_packet(&mut buf, v, |first, body| {
            if first & 0xF0 == proto::PUBACK {
                let (pid, rc) = match proto::parse_puback(body) {
                    Ok(x) => x,
                    Err(e) => {
                        return Err(err_str("PUBACK", e));
                    }
                };
                let now = now_ns();
                st.acked += 1;
                st.last_ack_ns = now;
                if rc >= 0x80 {
                    st.failures += 1;
                }
                if let Some(t) = sent_at.get(usize::from(pid)) {
                    st.hist
                        .saturating_record(now.saturating_sub(t.load(Ordering::Relaxed)).max(1));
                }
                let _ = ids.send(pid);
            }
            Ok(())
        });
        if let Err(e) = r {
            st.error = Some(e);
            break;
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        match read_or_stop(&mut rd, &mut buf, &mut stop).await {
            Read::Data => {}
            Read::Closed => {
                st.error = Some("connection closed by the broker".into());
                break;
            }
            Read::Failed(e) => {
                st.error = Some(e);
                break;
            }
            Read::Stopped => break,
        }
    }
    st
}

pub(super) async fn publish_qos1(
    rd: ReadHalf,
    mut wr: WriteHalf,
    buf: BytesMut,
    plan: PubPlan,
) -> PubStats {
    let sent_at: Arc<Vec<AtomicU64>> =
        Arc::new((0..=u16::MAX as usize).map(|_| AtomicU64::new(0)).collect());
    let (id_tx, mut id_rx) = mpsc::unbounded_channel::<u16>();
    for id in 1..=plan.window {
        let _ = id_tx.send(id);
    }
    let (stop_tx, stop_rx) = oneshot::channel();
    let reader: JoinHandle<AckStats> = tokio::spawn(read_acks(
        rd,
        buf,
        plan.version,
        sent_at.clone(),
        id_tx,
        stop_rx,
    ));

    let mut error = None;
    let mut out = Vec::with_capacity(MAX_BATCH_BYTES + plan.payload_size + 256);
    let mut seq = 0u64;
    // A free packet id taken from the pool but not used yet.
    let mut spare: Option<u16> = None;
    while !plan.done(seq) && Instant::now() < plan.until {
        let Some(allowed) = plan.allowed_now(seq).await else {
            continue;
        };
        // Wait for one free packet id, then take whatever else is free without waiting.
        let mut id = match spare.take() {
            Some(id) => Some(id),
            None => match timeout_at(plan.until.into(), id_rx.recv()).await {
                Ok(Some(id)) => Some(id),
                Ok(None) => break, // the reader ended: the broker disconnected
                Err(_) => break,   // deadline
            },
        };
        out.clear();
        let mut n = 0;
        while n < allowed && !plan.done(seq) && out.len() < MAX_BATCH_BYTES {
            let pid = match id.take().or_else(|| id_rx.try_recv().ok()) {
                Some(pid) => pid,
                None => break,
            };
            sent_at[usize::from(pid)].store(now_ns(), Ordering::Relaxed);
            plan.encode(&mut out, seq, pid);
            seq += 1;
            n += 1;
        }
        spare = id;
        if let Err(e) = wr.write_all(&out).await {
            error = Some(err_str("write PUBLISH", e));
            break;
        }
    }
    let done_publishing_ns = now_ns();

    drain(&mut id_rx, usize::from(spare.is_some()), &plan).await;
    let _ = stop_tx.send(());
    let acks = match tokio::time::timeout(Duration::from_secs(2), reader).await {
        Ok(Ok(a)) => Some(a),
        _ => None,
    };
    disconnect(wr).await;
    with_acks(PubStats::new(seq, done_publishing_ns, error), acks)
}

/// Every packet id is either free (in the channel, or `free` of them taken out) or
/// in flight: waits until all are free again, as long as PUBACKs keep coming.
async fn drain(id_rx: &mut mpsc::UnboundedReceiver<u16>, mut free: usize, plan: &PubPlan) {
    let mut drain_deadline = Instant::now() + plan.drain;
    while free < usize::from(plan.window) {
        match timeout_at(drain_deadline.into(), id_rx.recv()).await {
            Ok(Some(_)) => {
                free += 1;
                drain_deadline = Instant::now() + plan.drain;
            }
            Ok(None) | Err(_) => break,
        }
    }
}

/// The publisher's statistics with what its PUBACK reader counted (`None`: it did
/// not stop, an error unless publishing had one).
fn with_acks(mut st: PubStats, acks: Option<AckStats>) -> PubStats {
    if let Some(a) = acks {
        st.acked = a.acked;
        st.ack_failures = a.failures;
        st.last_ack_ns = a.last_ack_ns;
        st.ack_hist = a.hist;
        if st.error.is_none() {
            st.error = a.error;
        }
    } else if st.error.is_none() {
        st.error = Some("PUBACK reader did not stop".into());
    }
    st
}
