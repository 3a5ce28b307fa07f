//! The clients of the linearizability test: rumqttc MQTT 5 connections speaking the
//! state store's request/response as the SDKs do (QoS 1, Response Topic, Correlation
//! Data, `__ts` and `__ft`), each running one request at a time and recording when it
//! invoked it and when (and what) it got back. A client whose server died records its
//! request as open and stops.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::mpsc;
use tokio::time::timeout;

use super::model::{Cond, Op, Ret, Token, Val, Version};
use super::wgl::Operation;

const REQUEST_TOPIC: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";
/// How long one answer may take on a loaded machine before the test gives up.
const PATIENCE: Duration = Duration::from_secs(60);

/// One operation of the history, with its key.
pub type Recorded = Operation<(usize, Op), Ret>;

/// The values and fencing tokens on the wire.
pub fn value_bytes(v: Val) -> Vec<u8> {
    format!("v{v}").into_bytes()
}

/// Fencing token `t` as an HLC: later ranks are later clocks, all a little in the past.
pub fn token(base_ms: u64, t: Token) -> String {
    format!("{base_ms:015}:{t:05}:fence")
}

fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn payload(key: usize, op: &Op) -> (Vec<u8>, Option<Token>) {
    let key = format!("lin-{key}").into_bytes();
    match *op {
        Op::Set { value, cond, ft } => {
            let v = value_bytes(value);
            let mut args: Vec<&[u8]> = vec![b"SET", &key, &v];
            match cond {
                Cond::Always => {}
                Cond::Nx => args.push(b"NX"),
                Cond::Nex => args.push(b"NEX"),
            }
            (resp(&args), ft)
        }
        Op::Get => (resp(&[b"GET", &key]), None),
        Op::Del { ft } => (resp(&[b"DEL", &key]), ft),
        Op::VDel { value, ft } => (resp(&[b"VDEL", &key, &value_bytes(value)]), ft),
    }
}

fn parse_version(ts: Option<&str>) -> Version {
    let ts = ts.expect("this answer carries __ts");
    let mut fields = ts.split(':');
    let mut number = || {
        fields
            .next()
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("version {ts:?}"))
    };
    (number(), number())
}

/// The answer as the model's result; panics on anything the store should never say.
fn parse_ret(op: &Op, payload: &[u8], ts: Option<&str>) -> Ret {
    match payload {
        b"+OK\r\n" => Ret::Ok(parse_version(ts)),
        b":1\r\n" => Ret::Deleted(parse_version(ts)),
        b":0\r\n" => Ret::Absent,
        b"$-1\r\n" => Ret::Nil,
        b":-1\r\n" if matches!(op, Op::Set { .. }) => Ret::NotSet(parse_version(ts)),
        b":-1\r\n" => Ret::Mismatch(parse_version(ts)),
        b"-ERR a fencing token is required for this request\r\n" => Ret::FenceRequired,
        b"-ERR the request fencing token is a lower version than the fencing token protecting the resource\r\n" => {
            Ret::FenceLower
        }
        _ => {
            let text = String::from_utf8_lossy(payload);
            let value = text
                .strip_prefix("$2\r\nv")
                .and_then(|rest| rest.strip_suffix("\r\n"))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("unexpected answer {text:?} to {op:?}"));
            Ret::Value(value, parse_version(ts))
        }
    }
}

/// Nanoseconds since `epoch`.
pub fn since(epoch: Instant) -> u64 {
    epoch.elapsed().as_nanos() as u64
}

/// A small xorshift generator, seeded per client.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A random operation on a random key: SET (plain, NX, NEX), GET, DEL, VDEL over a few
/// values, with a fencing token of a random rank a third of the time.
pub fn random_op(rng: &mut Rng, keys: usize) -> (usize, Op) {
    let key = rng.below(keys as u64) as usize;
    let value = rng.below(3) as Val;
    let ft = (rng.below(3) == 0).then(|| rng.below(3) as Token);
    let op = match rng.below(20) {
        0..=5 => Op::Set {
            value,
            cond: Cond::Always,
            ft,
        },
        6..=7 => Op::Set {
            value,
            cond: Cond::Nx,
            ft,
        },
        8..=9 => Op::Set {
            value,
            cond: Cond::Nex,
            ft,
        },
        10..=14 => Op::Get,
        15..=16 => Op::Del { ft },
        _ => Op::VDel { value, ft },
    };
    (key, op)
}

/// What a client shares with the test: when the run began, the fencing tokens' clock,
/// how many operations completed (so the test can pick a moment to kill the server).
#[derive(Clone)]
pub struct Shared {
    pub epoch: Instant,
    pub token_base_ms: u64,
    pub completed: Arc<AtomicUsize>,
}

impl Shared {
    pub fn new() -> Self {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        Self {
            epoch: Instant::now(),
            token_base_ms: now_ms - 1_000,
            completed: Arc::new(AtomicUsize::new(0)),
        }
    }
}

/// Runs `ops` random operations as client `id` (one at a time), returning the history
/// it saw. Stops early, with its last request open, if the server goes away.
pub async fn run_client(
    addr: SocketAddr,
    id: String,
    client: usize,
    seed: u64,
    ops: usize,
    keys: usize,
    shared: Shared,
) -> Vec<Recorded> {
    let mut opts = MqttOptions::new(id.clone(), addr.ip().to_string(), addr.port());
    opts.set_keep_alive(Duration::from_secs(60));
    opts.set_connection_timeout(PATIENCE.as_secs());
    let (mqtt, mut eventloop) = AsyncClient::new(opts, 100);
    let (tx, mut rx) = mpsc::unbounded_channel::<Option<Publish>>();
    tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let _ = tx.send(Some(p));
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    let _ = tx.send(None);
                }
                Ok(_) => {}
                // The server is gone: dropping `tx` tells the client.
                Err(_) => return,
            }
        }
    });
    let response_topic = format!("clients/{id}/services/statestore/command/response");
    mqtt.subscribe(response_topic.clone(), QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    let suback = timeout(PATIENCE, rx.recv()).await.expect("SUBACK in time");
    assert!(matches!(suback, Some(None)), "{id}: no SUBACK");
    let mut rng = Rng(seed | 1);
    let mut history = Vec::with_capacity(ops);
    for correlation in 0..ops as u64 {
        let (key, op) = random_op(&mut rng, keys);
        let (request, ft) = payload(key, &op);
        let call = since(shared.epoch);
        let answer = request_once(
            &mqtt,
            &mut rx,
            &response_topic,
            correlation,
            request,
            ft,
            &shared,
        );
        let ret = match answer.await {
            Some((payload, ts)) => {
                Some((since(shared.epoch), parse_ret(&op, &payload, ts.as_deref())))
            }
            None => None,
        };
        let open = ret.is_none();
        history.push(Operation {
            client,
            call,
            ret,
            op: (key, op),
        });
        if open {
            break;
        }
        shared.completed.fetch_add(1, Ordering::Relaxed);
    }
    let _ = mqtt.disconnect().await;
    history
}

/// Sends one request and waits for its answer: payload and `__ts`; `None` if the
/// connection ended first.
async fn request_once(
    mqtt: &AsyncClient,
    rx: &mut mpsc::UnboundedReceiver<Option<Publish>>,
    response_topic: &str,
    correlation: u64,
    request: Vec<u8>,
    ft: Option<Token>,
    shared: &Shared,
) -> Option<(Vec<u8>, Option<String>)> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let mut user = vec![
        ("__protVer".to_owned(), "1.0".to_owned()),
        ("__ts".to_owned(), format!("{now_ms:015}:00000:lin")),
    ];
    if let Some(ft) = ft {
        user.push(("__ft".to_owned(), token(shared.token_base_ms, ft)));
    }
    let props = PublishProperties {
        response_topic: Some(response_topic.to_owned()),
        correlation_data: Some(Bytes::copy_from_slice(&correlation.to_be_bytes())),
        message_expiry_interval: Some(60),
        user_properties: user,
        ..PublishProperties::default()
    };
    mqtt.publish_with_properties(REQUEST_TOPIC, QoS::AtLeastOnce, false, request, props)
        .await
        .ok()?;
    loop {
        let p = timeout(PATIENCE, rx.recv())
            .await
            .expect("an answer, or the connection's end, in time")??;
        let props = p.properties.as_ref().expect("response properties");
        if props.correlation_data.as_deref() != Some(&correlation.to_be_bytes()[..]) {
            continue;
        }
        let prop = |name: &str| {
            props
                .user_properties
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(prop("__stat").as_deref(), Some("200"), "{:?}", p.payload);
        return Some((p.payload.to_vec(), prop("__ts")));
    }
}
