//! The publisher side of the `mqtt` scenario: what a publisher is told to do
//! ([`PubPlan`]: topic, payload, count or deadline, rate), what it reports
//! ([`PubStats`]), and the QoS 0 publishing loop. The QoS 1 loop, with its
//! in-flight window and PUBACK reader, is in [`super::publisher_qos1`].

use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout_at;

use super::client::disconnect;
use super::publisher_qos1::publish_qos1;
use super::{HEADER_LEN, MAX_BATCH_BYTES, MAX_BATCH_MSGS};
use crate::common::{err_str, now_ns, Conn, ReadHalf, WriteHalf};
use crate::proto::{self, Version};
use crate::report::new_histogram;

#[derive(Debug)]
pub(super) struct PubStats {
    pub(super) published: u64,
    pub(super) acked: u64,
    pub(super) ack_failures: u64,
    pub(super) done_publishing_ns: u64,
    pub(super) last_ack_ns: u64,
    pub(super) ack_hist: Histogram<u64>,
    pub(super) error: Option<String>,
}

impl PubStats {
    /// Nothing acknowledged yet.
    pub(super) fn new(published: u64, done_publishing_ns: u64, error: Option<String>) -> Self {
        PubStats {
            published,
            acked: 0,
            ack_failures: 0,
            done_publishing_ns,
            last_ack_ns: 0,
            ack_hist: new_histogram(),
            error,
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct PubPlan {
    pub(super) index: u32,
    pub(super) version: Version,
    pub(super) qos: u8,
    pub(super) topic: Vec<u8>,
    pub(super) payload_size: usize,
    /// Stop after this many messages (None: until `until`).
    pub(super) count: Option<u64>,
    /// Stop publishing at this instant (the end of `--duration`, or the hard timeout).
    pub(super) until: Instant,
    pub(super) start: Instant,
    pub(super) rate: f64,
    pub(super) window: u16,
    pub(super) drain: Duration,
}

impl PubPlan {
    /// Appends message `seq` to `out`.
    #[inline]
    pub(super) fn encode(&self, out: &mut Vec<u8>, seq: u64, packet_id: u16) {
        proto::encode_publish_header(
            out,
            self.version,
            &self.topic,
            self.qos,
            packet_id,
            self.payload_size,
        );
        out.extend_from_slice(&self.index.to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&now_ns().to_le_bytes());
        out.resize(out.len() + self.payload_size - HEADER_LEN, 0);
    }

    pub(super) fn done(&self, seq: u64) -> bool {
        self.count.is_some_and(|k| seq >= k)
    }

    /// How many messages may be sent now (rate limiting), or when the next is due.
    fn allowance(&self, seq: u64) -> Result<usize, Instant> {
        if self.rate <= 0.0 {
            return Ok(MAX_BATCH_MSGS);
        }
        let due = (self.start.elapsed().as_secs_f64() * self.rate) as u64 + 1;
        if due > seq {
            Ok((due - seq).min(MAX_BATCH_MSGS as u64) as usize)
        } else {
            Err(self.start + Duration::from_secs_f64(seq as f64 / self.rate))
        }
    }

    /// [`Self::allowance`], or `None` after sleeping until the next message is
    /// due (or `until`), so the caller checks its loop condition again.
    pub(super) async fn allowed_now(&self, seq: u64) -> Option<usize> {
        match self.allowance(seq) {
            Ok(n) => Some(n),
            Err(at) => {
                tokio::time::sleep_until(at.min(self.until).into()).await;
                None
            }
        }
    }
}

pub(super) async fn run_publisher(conn: Conn, plan: PubPlan) -> PubStats {
    let (rd, wr) = tokio::io::split(conn.stream);
    if plan.qos == 0 {
        publish_qos0(rd, wr, conn.buf, plan).await
    } else {
        publish_qos1(rd, wr, conn.buf, plan).await
    }
}

/// Watches the read side of a QoS 0 publisher, only to notice a broker disconnect.
async fn watch_qos0(mut rd: ReadHalf, mut buf: BytesMut, v: Version) -> String {
    loop {
        while let Ok(Some((first, hl, rl))) = proto::frame(&buf) {
            if first & 0xF0 == proto::DISCONNECT {
                return proto::describe_disconnect(v, &buf[hl..hl + rl]);
            }
            buf.advance(hl + rl);
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) => return "connection closed by the broker".into(),
            Ok(_) => {}
            Err(e) => return err_str("read", e),
        }
    }
}

async fn publish_qos0(rd: ReadHalf, mut wr: WriteHalf, buf: BytesMut, plan: PubPlan) -> PubStats {
    let mut watcher = tokio::spawn(watch_qos0(rd, buf, plan.version));
    let mut st = PubStats::new(0, 0, None);
    let mut out = Vec::with_capacity(MAX_BATCH_BYTES + plan.payload_size + 256);
    let mut seq = 0u64;
    while !plan.done(seq) && Instant::now() < plan.until {
        let Some(allowed) = plan.allowed_now(seq).await else {
            continue;
        };
        out.clear();
        let first = seq;
        for _ in 0..allowed {
            if plan.done(seq) || out.len() >= MAX_BATCH_BYTES {
                break;
            }
            plan.encode(&mut out, seq, 0);
            seq += 1;
        }
        match timeout_at(plan.until.max(Instant::now()).into(), wr.write_all(&out)).await {
            Ok(Ok(())) => st.published = seq,
            Ok(Err(e)) => {
                st.published = first;
                st.error = Some(err_str("write PUBLISH", e));
                break;
            }
            Err(_) => {
                // Stuck behind the broker's back-pressure at the deadline: the batch
                // may be partly sent; count it so losses are not hidden.
                st.published = seq;
                break;
            }
        }
        if watcher.is_finished() {
            break;
        }
    }
    st.done_publishing_ns = now_ns();
    if watcher.is_finished() {
        if let Ok(e) = (&mut watcher).await {
            st.error.get_or_insert(e);
        }
    } else {
        watcher.abort();
    }
    disconnect(wr).await;
    st
}
