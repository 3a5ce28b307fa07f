//! The subscriber side of the `mqtt` scenario: one task per subscribing
//! connection that acknowledges QoS 1 deliveries, decodes the benchmark header
//! of every message and keeps per-publisher sequence state to count latency,
//! gaps, duplicates and foreign messages ([`SubStats`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hdrhistogram::Histogram;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use super::client::{disconnect, read_or_stop, Read};
use super::HEADER_LEN;
use crate::common::{err_str, for_each_packet, now_ns, Conn};
use crate::proto::{self, Version};
use crate::report::new_histogram;

#[derive(Debug)]
pub(super) struct SubStats {
    pub(super) received: u64,
    pub(super) duplicates: u64,
    pub(super) gaps: u64,
    pub(super) foreign: u64,
    pub(super) last_recv_ns: u64,
    pub(super) hist: Histogram<u64>,
    pub(super) error: Option<String>,
}

impl SubStats {
    fn new() -> Self {
        SubStats {
            received: 0,
            duplicates: 0,
            gaps: 0,
            foreign: 0,
            last_recv_ns: 0,
            hist: new_histogram(),
            error: None,
        }
    }

    /// A message received at `now`: its latency, and whether it is its publisher's next
    /// (`next_seq`, per publisher), after a gap, again, or not the benchmark's.
    fn record(&mut self, pl: &[u8], now: u64, next_seq: &mut [u64]) {
        self.last_recv_ns = now;
        if pl.len() < HEADER_LEN {
            self.foreign += 1;
            return;
        }
        let pub_id = u32::from_le_bytes([pl[0], pl[1], pl[2], pl[3]]) as usize;
        let seq = u64::from_le_bytes(pl[4..12].try_into().unwrap_or_default());
        let ts = u64::from_le_bytes(pl[12..20].try_into().unwrap_or_default());
        match next_seq.get_mut(pub_id) {
            None => self.foreign += 1,
            Some(next) => {
                self.hist.saturating_record(now.saturating_sub(ts).max(1));
                if seq == *next {
                    *next += 1;
                } else if seq > *next {
                    self.gaps += seq - *next;
                    *next = seq + 1;
                } else {
                    self.duplicates += 1;
                }
            }
        }
    }
}

pub(super) async fn run_subscriber(
    conn: Conn,
    v: Version,
    n_publishers: usize,
    received_total: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) -> SubStats {
    let (mut rd, mut wr) = tokio::io::split(conn.stream);
    let mut buf = conn.buf;
    let mut st = SubStats::new();
    let mut next_seq = vec![0u64; n_publishers];
    let mut acks: Vec<u8> = Vec::with_capacity(4096);

    loop {
        let mut n = 0u64;
        let r = for_each_packet(&mut buf, v, |first, body| {
            if first & 0xF0 == proto::PUBLISH {
                let p = match proto::parse_publish(v, first, body) {
                    Ok(p) => p,
                    Err(e) => {
                        return Err(err_str("PUBLISH", e));
                    }
                };
                if p.qos == 1 {
                    proto::encode_puback(&mut acks, p.packet_id);
                }
                n += 1;
                st.record(p.payload, now_ns(), &mut next_seq);
            }
            Ok(())
        });
        if let Err(e) = r {
            st.error = Some(e);
            break;
        }
        if n > 0 {
            st.received += n;
            received_total.fetch_add(n, Ordering::Relaxed);
        }
        if !acks.is_empty() {
            if let Err(e) = wr.write_all(&acks).await {
                st.error = Some(err_str("write PUBACK", e));
                break;
            }
            acks.clear();
        }
        if *stop.borrow() {
            break;
        }
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(64 * 1024);
        }
        match read_or_stop(&mut rd, &mut buf, stop.changed()).await {
            Read::Data => {}
            Read::Closed => {
                if !*stop.borrow() {
                    st.error = Some("connection closed by the broker".into());
                }
                break;
            }
            Read::Failed(e) => {
                st.error = Some(e);
                break;
            }
            Read::Stopped => break,
        }
    }
    disconnect(wr).await;
    st
}
