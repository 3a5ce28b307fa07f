//! The request loop of the `statestore` scenario: a [`Phase`] says how requests
//! are chosen (populate: SET given keys; measure: random GET/SET mix) and when
//! the phase ends; [`run_phase`] keeps `pipeline` requests outstanding on one
//! connection until then.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout_at;

use super::client::Client;
use super::stats::OpStats;
use super::Op;
use crate::common::{err_str, now_ns};

/// xorshift64*: cheap, and good enough to spread keys.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    #[inline]
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    #[inline]
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
    #[inline]
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// How a phase chooses requests and when it ends.
#[derive(Clone)]
pub(super) struct Phase {
    /// Populate: SET these keys in order (then stop).
    pub(super) populate: Option<Vec<u64>>,
    pub(super) count: Option<u64>,
    pub(super) duration: Option<Duration>,
    pub(super) hard_timeout: Duration,
    pub(super) pipeline: usize,
    pub(super) ratio_get: f64,
    pub(super) keys: u64,
    /// No response for this long: the outstanding requests are given up.
    pub(super) response_timeout: Duration,
}

impl Phase {
    /// How many requests the phase sends (`None`: until its time is up).
    fn requests(&self) -> Option<u64> {
        match &self.populate {
            Some(keys) => Some(keys.len() as u64),
            None => self.count,
        }
    }

    /// The phase's request number `sent` (from 0): the next key to populate, or a GET
    /// (with the phase's ratio) or SET of a random key.
    fn request(&self, sent: u64, rng: &mut Rng) -> (Op, u64) {
        match &self.populate {
            Some(keys) => (Op::Set, keys[sent as usize]),
            None => {
                let op = if self.ratio_get > 0.0 && rng.unit() < self.ratio_get {
                    Op::Get
                } else {
                    Op::Set
                };
                (op, rng.below(self.keys))
            }
        }
    }
}

/// Runs one phase on a connection (a connection failure ends it with `error` set).
pub(super) async fn run_phase(
    stream: &mut crate::common::Stream,
    buf: &mut BytesMut,
    c: &mut Client,
    rng: &mut Rng,
    ph: &Phase,
) -> OpStats {
    let mut st = OpStats::new();
    st.start_ns = now_ns();
    let start = Instant::now();
    let until = start + ph.duration.unwrap_or(ph.hard_timeout).min(ph.hard_timeout);
    let hard = start + ph.hard_timeout;
    let mut out: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut acks: Vec<u8> = Vec::with_capacity(1024);
    let mut sent = 0u64;
    let mut last_progress = Instant::now();
    let total = ph.requests();
    loop {
        // Issue requests up to the pipeline depth.
        out.clear();
        out.extend_from_slice(&acks);
        acks.clear();
        let now = Instant::now();
        while c.outstanding.len() < ph.pipeline && total.is_none_or(|t| sent < t) && now < until {
            let (op, key) = ph.request(sent, rng);
            c.encode(&mut out, op, key);
            sent += 1;
        }
        if !out.is_empty() {
            if let Err(e) = stream.write_all(&out).await {
                st.error = Some(err_str("write", e));
                break;
            }
        }
        let more = total.is_none_or(|t| sent < t) && Instant::now() < until;
        if c.outstanding.is_empty() && !more {
            break;
        }
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(64 * 1024);
        }
        let deadline = (last_progress + ph.response_timeout).min(hard + ph.response_timeout);
        match timeout_at(deadline.into(), stream.read_buf(buf)).await {
            Ok(Ok(0)) => {
                st.error = Some("connection closed by the broker".into());
                break;
            }
            Ok(Ok(_)) => {
                let before = c.outstanding.len();
                if let Err(e) = c.handle(buf, &mut acks, &mut st) {
                    st.error = Some(e);
                    break;
                }
                if c.outstanding.len() < before {
                    last_progress = Instant::now();
                }
            }
            Ok(Err(e)) => {
                st.error = Some(err_str("read", e));
                break;
            }
            Err(_) => {
                st.note(|| {
                    format!(
                        "no response within {:.0}s",
                        ph.response_timeout.as_secs_f64()
                    )
                });
                break;
            }
        }
    }
    st.end_ns = now_ns();
    if !acks.is_empty() {
        let _ = stream.write_all(&acks).await;
    }
    st.timed_out = c.outstanding.len() as u64;
    c.outstanding.clear();
    st
}
