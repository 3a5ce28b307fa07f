//! Phases 1 to 4 of the `mqtt` scenario (see the module documentation of
//! [`super`]): validate the arguments, connect and subscribe, start the
//! publishers and subscribers, wait for publishing and delivery to finish.
//! Phase 5, turning the collected statistics into a report, is in
//! [`super::summary`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::args::MqttArgs;
use super::client::{connect, subscribe};
use super::publisher::{run_publisher, PubPlan, PubStats};
use super::subscriber::{run_subscriber, SubStats};
use super::summary::{self, Outcome};
use super::topics::{self, TopicPlan};
use super::DEFAULT_MESSAGES;
use crate::common::{self, all, base, join_each, now_ns, resolve, secs};
use crate::proto::Version;
use crate::report::Report;

pub async fn run(args: MqttArgs) -> Result<Report, String> {
    let _ = base();
    let version = if args.v311 {
        Version::V311
    } else {
        Version::V5
    };
    let n_pub = args.publishers as usize;
    let n_sub = args.subscribers as usize;
    let qos = args.qos;
    if !(args.rate >= 0.0 && args.rate.is_finite()) {
        return Err("--rate must be a non-negative number".into());
    }
    let duration = args.duration.map(secs).transpose()?;
    let count = match duration {
        Some(_) => None,
        None => Some(args.messages_per_publisher.unwrap_or(DEFAULT_MESSAGES)),
    };
    let hard_timeout = secs(args.timeout)?;
    let drain = secs(args.drain_timeout)?;
    let connect_timeout = secs(args.connect_timeout)?;
    if let Some(d) = duration {
        if d > hard_timeout {
            return Err("--duration is longer than --timeout".into());
        }
    }

    let addr = resolve(&args.host, args.port).await?;
    let sub_addr = match args.subscriber_port {
        Some(port) => resolve(&args.host, port).await?,
        None => addr,
    };
    if let Some(ca) = &args.tls_ca {
        crate::common::use_tls(ca, &args.tls_name)?;
    }

    let run_id = format!(
        "{:x}-{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    );
    let TopicPlan {
        topics,
        matching,
        filters,
    } = topics::plan(args.topic_mode, &args.topic_prefix, &run_id, n_pub, n_sub);

    // Nothing is sent while a subscriber waits; make sure the broker does not
    // time it out during the run.
    let run_bound = duration.unwrap_or(hard_timeout) + drain * 2 + Duration::from_secs(60);
    let keep_alive = run_bound.as_secs().clamp(60, u64::from(u16::MAX)) as u16;

    let progress = |msg: String| common::progress(args.quiet, msg);

    // Phase 1: subscribers connected and subscribed.
    progress(format!(
        "connecting {n_sub} subscribers to {sub_addr} ({version:?}, QoS {qos})"
    ));
    let deadline = Instant::now() + connect_timeout;
    let client_prefix = format!("shb-{run_id}");
    let filters = Arc::new(filters);
    let sub_conns = {
        let prefix = client_prefix.clone();
        let filters = filters.clone();
        all(n_sub, deadline, "subscriber", move |j| {
            let id = format!("{prefix}-s{j}");
            let filters = filters.clone();
            async move {
                let mut c = connect(sub_addr, version, &id, keep_alive).await?;
                let granted = subscribe(&mut c, version, &filters[j], qos).await?;
                Ok((c, granted))
            }
        })
        .await?
    };
    let mut report = Report::new("mqtt");
    if let Some(g) = sub_conns.iter().map(|(_, g)| *g).min() {
        if g < qos {
            report.warn(format!(
                "broker granted subscription QoS {g} < requested {qos}"
            ));
        }
    }

    // Phase 2: publishers connected.
    progress(format!("connecting {n_pub} publishers"));
    let deadline = Instant::now() + connect_timeout;
    let pub_conns = {
        let prefix = client_prefix.clone();
        all(n_pub, deadline, "publisher", move |i| {
            let id = format!("{prefix}-p{i}");
            async move { connect(addr, version, &id, keep_alive).await }
        })
        .await?
    };
    let mut window = args.inflight;
    if qos == 1 {
        if let Some(rm) = pub_conns.iter().filter_map(|c| c.ack.receive_maximum).min() {
            if rm < window {
                report.warn(format!(
                    "--inflight {window} capped to the broker's Receive Maximum {rm}"
                ));
                window = rm.max(1);
            }
        }
    }
    if let Some(mq) = pub_conns.iter().filter_map(|c| c.ack.maximum_qos).min() {
        if mq < qos {
            return Err(format!("broker supports at most QoS {mq}"));
        }
    }
    if let Some(ka) = pub_conns
        .iter()
        .chain(sub_conns.iter().map(|(c, _)| c))
        .filter_map(|c| c.ack.server_keep_alive)
        .min()
    {
        if ka != 0 && Duration::from_secs(u64::from(ka)) < run_bound {
            report.warn(format!(
                "broker imposed keep-alive {ka}s; idle subscribers may be disconnected"
            ));
        }
    }

    // Phase 3: go.
    let received_total = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let sub_handles: Vec<JoinHandle<SubStats>> = sub_conns
        .into_iter()
        .map(|(c, _)| {
            tokio::spawn(run_subscriber(
                c,
                version,
                n_pub,
                received_total.clone(),
                stop_rx.clone(),
            ))
        })
        .collect();

    progress(match (count, duration) {
        (Some(k), _) => format!("publishing {k} messages per publisher"),
        (None, Some(d)) => format!("publishing for {:.1}s", d.as_secs_f64()),
        _ => String::new(),
    });
    let cpu_at_start = args.broker_pid.and_then(common::proc_cpu_secs);
    let start = Instant::now();
    let t0_ns = now_ns();
    let until = start + duration.unwrap_or(hard_timeout).min(hard_timeout);
    let pub_handles: Vec<JoinHandle<PubStats>> = pub_conns
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let plan = PubPlan {
                index: i as u32,
                version,
                qos,
                topic: topics[i].clone().into_bytes(),
                payload_size: args.payload_size as usize,
                count,
                until,
                start,
                rate: args.rate,
                window,
                drain,
            };
            tokio::spawn(run_publisher(c, plan))
        })
        .collect();

    // Publishers stop by `until`, then drain acks for at most a few drain periods.
    let pub_deadline = until + drain * 4 + Duration::from_secs(5);
    let mut pubs = Vec::with_capacity(n_pub);
    join_each(
        pub_handles,
        pub_deadline,
        "publisher",
        "did not finish in time",
        &mut report,
        |i, st: PubStats, report| {
            if let Some(e) = &st.error {
                report.error(format!("publisher {i}: {e}"));
            }
            pubs.push(st);
        },
    )
    .await;
    if count.is_some() && Instant::now() >= until {
        report.warn("publishing hit --timeout before sending all messages".into());
    }

    // Phase 4: wait for deliveries.
    let published: u64 = pubs.iter().map(|p| p.published).sum();
    let expected: u64 = pubs
        .iter()
        .enumerate()
        .map(|(i, p)| p.published * matching[i])
        .sum();
    progress(format!(
        "published {published}; waiting for {expected} deliveries"
    ));
    let mut last = received_total.load(Ordering::Relaxed);
    let mut last_change = Instant::now();
    let delivery_deadline = Instant::now() + hard_timeout.max(drain);
    loop {
        let r = received_total.load(Ordering::Relaxed);
        if r >= expected {
            break;
        }
        let now = Instant::now();
        if r != last {
            last = r;
            last_change = now;
        } else if now.duration_since(last_change) >= drain
            || now >= delivery_deadline
            || sub_handles.iter().all(|h| h.is_finished())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let broker_cpu_s = cpu_at_start
        .zip(args.broker_pid.and_then(common::proc_cpu_secs))
        .map(|(a, b)| b - a);
    let _ = stop_tx.send(true);
    let mut subs = Vec::with_capacity(n_sub);
    let sub_deadline = Instant::now() + Duration::from_secs(5);
    join_each(
        sub_handles,
        sub_deadline,
        "subscriber",
        "did not stop",
        &mut report,
        |j, st: SubStats, report| {
            if let Some(e) = &st.error {
                report.error(format!("subscriber {j}: {e}"));
            }
            subs.push(st);
        },
    )
    .await;

    // Phase 5: report.
    Ok(summary::summarize(
        report,
        &args,
        Outcome {
            addr,
            count,
            duration,
            window,
            t0_ns,
            published,
            expected,
            pubs,
            subs,
            broker_cpu_s,
        },
    ))
}
