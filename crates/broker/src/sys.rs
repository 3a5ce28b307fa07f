//! `$SYS/broker/...` topics in Mosquitto's names, off unless `[mqtt]
//! sys_interval_secs` is set: every interval the broker publishes, as retained QoS 0
//! messages, what it counts for `/metrics` (the same counters, read the same way).
//!
//! Only the broker publishes them: clients may not publish on `$` topics (the built-in
//! protections), a filter starting with a wildcard (`#`, `+/...`) never matches them
//! [MQTT-4.7.2-1], so a client subscribes to `$SYS/#` itself, and once authorization
//! rules exist it needs a grant on `$SYS/...` (a grant of `#` does not cover it). A
//! value is published again only when it changed (the uptime every time). They are
//! never written to the retained store on disk: a restarted broker makes them anew.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use statehub_mqtt_codec::{PublishProperties, QoS};
use tokio::task::JoinHandle;

use crate::message::Message;
use crate::Broker;

/// Where every topic of this module starts.
pub const PREFIX: &str = "$SYS/broker/";

/// Whether `topic` is a `$SYS` topic.
pub fn is_sys(topic: &str) -> bool {
    topic.starts_with("$SYS/")
}

/// Starts publishing if `[mqtt] sys_interval_secs` is set, until the broker shuts
/// down; `version` is what `$SYS/broker/version` says.
pub fn spawn(broker: &Broker, version: &str) -> Option<JoinHandle<()>> {
    let secs = broker.config().sys_interval_secs;
    if secs == 0 {
        return None;
    }
    tracing::info!("$SYS/broker/... topics every {secs} s ([mqtt] sys_interval_secs)");
    let sys = Sys {
        broker: broker.clone(),
        version: version.to_owned(),
        started: Instant::now(),
        sent: HashMap::new(),
        load: HashMap::new(),
    };
    Some(tokio::spawn(sys.run(Duration::from_secs(secs))))
}

/// The counters a `load/...` average follows, with their last reading.
#[derive(Debug, Default, Clone, Copy)]
struct Load {
    last: u64,
    averages: [f64; 3],
}

/// The load windows, in minutes, and their topic suffixes.
const WINDOWS: [(f64, &str); 3] = [(1.0, "1min"), (5.0, "5min"), (15.0, "15min")];

struct Sys {
    broker: Broker,
    version: String,
    started: Instant,
    /// What was last published on each topic (after `PREFIX`).
    sent: HashMap<&'static str, String>,
    load: HashMap<&'static str, Load>,
}

impl Sys {
    async fn run(mut self, every: Duration) {
        let shutdown = self.broker.shutdown_token();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = Instant::now();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = Instant::now();
            let values = self.values(now.duration_since(last));
            last = now;
            for (name, value) in values {
                if name != "uptime" && self.sent.get(name) == Some(&value) {
                    continue;
                }
                self.publish(name, &value);
                self.sent.insert(name, value);
            }
        }
    }

    fn publish(&self, name: &str, value: &str) {
        let msg = Message {
            topic: format!("{PREFIX}{name}").into(),
            payload: Bytes::copy_from_slice(value.as_bytes()),
            qos: QoS::AtMostOnce,
            retain: true,
            properties: PublishProperties::default(),
            expires_at: None,
            publisher: None,
            recipient: None,
        };
        self.broker.publish(Arc::new(msg));
    }

    /// Every topic's value now; `elapsed` since the previous reading (for the loads).
    fn values(&mut self, elapsed: Duration) -> Vec<(&'static str, String)> {
        let m = self.broker.metrics();
        let g = self.broker.gauges();
        let sum = |counts: [(u64, u64); 16], bytes: bool| -> u64 {
            counts.iter().map(|c| if bytes { c.1 } else { c.0 }).sum()
        };
        let (inn, out) = (m.packets_in.snapshot(), m.packets_out.snapshot());
        // Index 3: PUBLISH (see `PACKET_TYPES`).
        let counters = [
            ("messages/received", sum(inn, false)),
            ("messages/sent", sum(out, false)),
            ("bytes/received", sum(inn, true)),
            ("bytes/sent", sum(out, true)),
            ("publish/messages/received", inn[3].0),
            ("publish/messages/sent", out[3].0),
        ];
        let mut values = vec![
            ("version", self.version.clone()),
            (
                "uptime",
                format!("{} seconds", self.started.elapsed().as_secs()),
            ),
            ("clients/connected", g.connections.to_string()),
            ("clients/disconnected", g.sessions_offline.to_string()),
            (
                "clients/total",
                (g.sessions_online + g.sessions_offline).to_string(),
            ),
            (
                "subscriptions/count",
                self.broker.subscription_count().to_string(),
            ),
            ("retained messages/count", g.retained_messages.to_string()),
            ("store/messages/count", g.queued_messages.to_string()),
            ("store/messages/bytes", g.queued_bytes.to_string()),
        ];
        values.extend(counters.iter().map(|(name, n)| (*name, n.to_string())));
        let connections = m.connections_accepted.load(Relaxed);
        for (name, now) in counters.into_iter().chain([("connections", connections)]) {
            values.extend(self.loads(name, now, elapsed));
        }
        values
    }

    /// `load/<name>/1min`, `5min` and `15min`: per-minute rates averaged as Mosquitto
    /// does (exponentially, over each window).
    fn loads(
        &mut self,
        name: &'static str,
        now: u64,
        elapsed: Duration,
    ) -> Vec<(&'static str, String)> {
        let secs = elapsed.as_secs_f64().max(0.001);
        let load = self.load.entry(name).or_insert(Load {
            last: now,
            averages: [0.0; 3],
        });
        let rate = now.saturating_sub(load.last) as f64 * 60.0 / secs;
        load.last = now;
        let mut out = Vec::with_capacity(3);
        for (i, (minutes, suffix)) in WINDOWS.iter().enumerate() {
            let decay = (-secs / (60.0 * minutes)).exp();
            load.averages[i] = rate + decay * (load.averages[i] - rate);
            out.push((load_topic(name, suffix), format!("{:.2}", load.averages[i])));
        }
        out
    }
}

/// `load/<name>/<window>`, from a fixed set of names (no allocation per tick).
fn load_topic(name: &str, window: &str) -> &'static str {
    macro_rules! names {
        ($($n:literal),*) => {
            match (name, window) {
                $(
                    ($n, "1min") => concat!("load/", $n, "/1min"),
                    ($n, "5min") => concat!("load/", $n, "/5min"),
                    ($n, _) => concat!("load/", $n, "/15min"),
                )*
                _ => "load/other",
            }
        };
    }
    names!(
        "messages/received",
        "messages/sent",
        "bytes/received",
        "bytes/sent",
        "publish/messages/received",
        "publish/messages/sent",
        "connections"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BrokerConfig;

    #[test]
    fn loads_follow_a_steady_rate() {
        let broker = Broker::new(BrokerConfig::default());
        let mut sys = Sys {
            broker,
            version: "v".into(),
            started: Instant::now(),
            sent: HashMap::new(),
            load: HashMap::new(),
        };
        let minute = Duration::from_secs(60);
        assert_eq!(sys.loads("bytes/sent", 0, minute)[0].1, "0.00");
        // 120 per minute for an hour: every window near 120.
        let mut last = Vec::new();
        for i in 1..=60 {
            last = sys.loads("bytes/sent", i * 120, minute);
        }
        assert_eq!(last[0], ("load/bytes/sent/1min", "120.00".to_owned()));
        let fifteen: f64 = last[2].1.parse().unwrap();
        assert!(fifteen > 110.0 && fifteen <= 120.0, "{fifteen}");
        assert_eq!(load_topic("connections", "5min"), "load/connections/5min");
    }
}
