//! `statehub pub` and `statehub sub`, with the mosquitto clients' flags where they
//! have one.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use serde_json::{Map, Value};
use statehub_mqtt_codec::{ByteString, Publish, PublishProperties, QoS};

use crate::client::Client;
use crate::connect::ConnectArgs;
use crate::error::{CliError, Exit};
use crate::output::{escape, note, put_bytes, Format, Out, OutputArgs};
use crate::signals::Signals;

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("payload").required(true))]
pub struct PubArgs {
    /// Topic to publish to
    #[arg(short = 't', long, value_name = "TOPIC")]
    topic: String,
    /// The message
    #[arg(short = 'm', long, value_name = "MESSAGE", group = "payload")]
    message: Option<String>,
    /// Send FILE as the message
    #[arg(short = 'f', long, value_name = "FILE", group = "payload")]
    file: Option<PathBuf>,
    /// Send standard input as one message
    #[arg(short = 's', long = "stdin-file", group = "payload")]
    stdin: bool,
    /// Send each line of standard input as a message
    #[arg(short = 'l', long = "stdin-line", group = "payload")]
    lines: bool,
    /// Send an empty message
    #[arg(short = 'n', long = "null-message", group = "payload")]
    null: bool,
    #[command(flatten)]
    props: MessageArgs,
    #[command(flatten)]
    connect: ConnectArgs,
}

/// QoS, retain and the MQTT 5 properties of a published message.
#[derive(Debug, Clone, Args)]
pub struct MessageArgs {
    /// Quality of service: 0, 1 or 2
    #[arg(short = 'q', long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    qos: u8,
    /// Retain the message
    #[arg(short = 'r', long)]
    retain: bool,
    /// User property NAME=VALUE (repeatable, order kept)
    #[arg(short = 'D', long = "user-property", value_name = "NAME=VALUE", value_parser = parse_property)]
    user_properties: Vec<(String, String)>,
    /// Response Topic property
    #[arg(long, value_name = "TOPIC")]
    response_topic: Option<String>,
    /// Correlation Data property
    #[arg(long, value_name = "DATA")]
    correlation_data: Option<String>,
    /// Message Expiry Interval property, in seconds
    #[arg(long, value_name = "SECS")]
    message_expiry: Option<u32>,
    /// Content Type property
    #[arg(long, value_name = "TYPE")]
    content_type: Option<String>,
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| "expected NAME=VALUE".to_owned())
}

fn qos(level: u8) -> QoS {
    QoS::from_u8(level).unwrap_or_default()
}

impl MessageArgs {
    fn publish(&self, topic: &str, payload: Bytes) -> Publish {
        let bs = |s: &str| ByteString::from(s);
        Publish {
            qos: qos(self.qos),
            retain: self.retain,
            topic: bs(topic),
            payload,
            properties: PublishProperties {
                message_expiry_interval: self.message_expiry,
                response_topic: self.response_topic.as_deref().map(bs),
                correlation_data: self
                    .correlation_data
                    .as_ref()
                    .map(|c| Bytes::copy_from_slice(c.as_bytes())),
                content_type: self.content_type.as_deref().map(bs),
                user_properties: self
                    .user_properties
                    .iter()
                    .map(|(k, v)| (bs(k), bs(v)))
                    .collect(),
                ..PublishProperties::default()
            },
            ..Publish::default()
        }
    }
}

pub async fn publish(a: PubArgs) -> Result<Exit, CliError> {
    let payload = match (&a.message, &a.file) {
        (Some(m), _) => Some(Bytes::copy_from_slice(m.as_bytes())),
        (_, Some(path)) => {
            Some(Bytes::from(std::fs::read(path).map_err(|e| {
                CliError::usage(format!("cannot read {}: {e}", path.display()))
            })?))
        }
        _ if a.stdin => {
            let mut all = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut all)
                .map_err(|e| CliError::usage(format!("cannot read standard input: {e}")))?;
            Some(Bytes::from(all))
        }
        _ if a.null => Some(Bytes::new()),
        _ => None,
    };
    let endpoint = a.connect.resolve("pub")?;
    let mut client = Client::connect(&endpoint).await?;
    let result = match payload {
        Some(payload) => client
            .publish(a.props.publish(&a.topic, payload))
            .await
            .map(|_| ())
            .map_err(CliError::from),
        None => publish_lines(&mut client, &a).await,
    };
    client.disconnect().await;
    result?;
    Ok(Exit::Success)
}

/// `-l`: one message per line of standard input, without its line ending.
async fn publish_lines(client: &mut Client, a: &PubArgs) -> Result<(), CliError> {
    for line in std::io::stdin().lock().split(b'\n') {
        let mut line =
            line.map_err(|e| CliError::usage(format!("cannot read standard input: {e}")))?;
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        client
            .publish(a.props.publish(&a.topic, Bytes::from(line)))
            .await?;
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct SubArgs {
    /// Topic filter to subscribe to (repeatable)
    #[arg(short = 't', long = "topic", value_name = "FILTER", required = true)]
    filters: Vec<String>,
    /// Quality of service of the subscriptions: 0, 1 or 2
    #[arg(short = 'q', long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    qos: u8,
    /// Exit after N messages
    #[arg(short = 'C', long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Stop after SECS seconds (exit 5 if --count was not reached)
    #[arg(short = 'W', long = "wait", value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    wait: Option<u64>,
    /// Print the topic before the payload
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Skip retained messages (those the subscription itself brings)
    #[arg(short = 'R', long = "no-retained")]
    no_retained: bool,
    #[command(flatten)]
    output: OutputArgs,
    #[command(flatten)]
    connect: ConnectArgs,
}

pub async fn subscribe(a: SubArgs) -> Result<Exit, CliError> {
    let mut signals = Signals::install()?;
    let endpoint = a.connect.resolve("sub")?;
    let mut client = Client::connect(&endpoint).await?;
    let filters: Vec<(String, QoS)> = a.filters.iter().map(|f| (f.clone(), qos(a.qos))).collect();
    let result = async {
        client.subscribe(&filters).await?;
        if endpoint.debug {
            note(&format!("subscribed to {}", a.filters.join(", ")));
        }
        receive(&mut client, &mut signals, &a).await
    }
    .await;
    client.disconnect().await;
    result
}

async fn receive(
    client: &mut Client,
    signals: &mut Signals,
    a: &SubArgs,
) -> Result<Exit, CliError> {
    let mut out = Out::new();
    let deadline = a
        .wait
        .map(|secs| tokio::time::Instant::now() + Duration::from_secs(secs));
    let mut seen = 0u64;
    while a.count.is_none_or(|count| seen < count) && !out.closed() {
        let until = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let message = tokio::select! {
            message = client.recv() => message?,
            () = signals.recv() => return Ok(Exit::Success),
            () = until => {
                return Ok(if a.count.is_some() { Exit::Timeout } else { Exit::Success });
            }
        };
        if a.no_retained && message.retain {
            continue;
        }
        print(&mut out, a, &message)?;
        seen += 1;
    }
    Ok(Exit::Success)
}

fn print(out: &mut Out, a: &SubArgs, m: &Publish) -> Result<(), CliError> {
    match a.output.format() {
        Format::Raw => out.write(&m.payload),
        Format::Text if a.verbose => out.line(&format!("{} {}", m.topic, escape(&m.payload))),
        Format::Text => out.line(&escape(&m.payload)),
        Format::Json => out.json(message_json(m)),
    }
}

fn message_json(m: &Publish) -> Map<String, Value> {
    let mut o = Map::new();
    o.insert("topic".into(), Value::from(&*m.topic));
    put_bytes(&mut o, "payload", &m.payload);
    o.insert("qos".into(), Value::from(m.qos as u8));
    o.insert("retain".into(), Value::from(m.retain));
    let p = &m.properties;
    if !p.user_properties.is_empty() {
        let pairs = p
            .user_properties
            .iter()
            .map(|(k, v)| Value::from(vec![Value::from(&**k), Value::from(&**v)]))
            .collect::<Vec<_>>();
        o.insert("user_properties".into(), Value::from(pairs));
    }
    if let Some(t) = &p.response_topic {
        o.insert("response_topic".into(), Value::from(&**t));
    }
    if let Some(c) = &p.correlation_data {
        put_bytes(&mut o, "correlation_data", c);
    }
    if let Some(t) = &p.content_type {
        o.insert("content_type".into(), Value::from(&**t));
    }
    if let Some(e) = p.message_expiry_interval {
        o.insert("message_expiry_interval".into(), Value::from(e));
    }
    o
}
