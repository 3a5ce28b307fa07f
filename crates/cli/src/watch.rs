//! `statehub kv watch`: KEYNOTIFY each key, print notifications until Ctrl-C,
//! `--count` or `-W`, then KEYNOTIFY STOP each key and disconnect.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use crate::connect::ConnectArgs;
use crate::error::{CliError, Exit};
use crate::kv::{open, Session};
use crate::output::{escape, note, put_bytes, Format, JsonArg};
use crate::signals::Signals;
use crate::store::proto::{Notification, Request, Response};
use crate::store::Change;

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The keys to watch
    #[arg(required = true)]
    keys: Vec<OsString>,
    /// Exit after N notifications
    #[arg(short = 'C', long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Stop after SECS seconds (exit 5 if --count was not reached)
    #[arg(short = 'W', long = "wait", value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    wait: Option<u64>,
    #[command(flatten)]
    output: JsonArg,
    #[command(flatten)]
    connect: ConnectArgs,
}

pub async fn run(a: &WatchArgs) -> Result<Exit, CliError> {
    let format = a.output.format();
    let mut signals = Signals::install()?;
    let mut s = open(&a.connect, "watch").await?;
    let result = watch(&mut s, &mut signals, a).await;
    let stopped = stop(&mut s, a).await;
    let result = match (result, stopped) {
        (Ok(Exit::Success), Err(e)) => Err(e),
        (result, _) => result,
    };
    s.finish(format, result).await
}

async fn watch(s: &mut Session, signals: &mut Signals, a: &WatchArgs) -> Result<Exit, CliError> {
    s.store.subscribe_notifications().await?;
    for key in &a.keys {
        let request = Request::KeyNotify {
            key: key.as_bytes(),
            stop: false,
        };
        match s.call(&request, None).await?.response {
            Response::Ok => {}
            Response::Error(e) => return Err(CliError::Store(e)),
            other => {
                return Err(CliError::BadResponse(format!(
                    "KEYNOTIFY answered {other:?}"
                )))
            }
        }
    }
    if s.endpoint.debug {
        note(&format!(
            "watching {} key{}; Ctrl-C to stop",
            a.keys.len(),
            if a.keys.len() == 1 { "" } else { "s" }
        ));
    }
    let deadline = a
        .wait
        .map(|secs| tokio::time::Instant::now() + Duration::from_secs(secs));
    let mut seen = 0u64;
    while a.count.is_none_or(|count| seen < count) && !s.out.closed() {
        let until = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let change = tokio::select! {
            change = s.store.next_change() => change?,
            () = signals.recv() => return Ok(Exit::Success),
            () = until => {
                return Ok(if a.count.is_some() { Exit::Timeout } else { Exit::Success });
            }
        };
        print(s, a.output.format(), &change)?;
        seen += 1;
    }
    Ok(Exit::Success)
}

/// Unregisters every key, if the connection still works.
async fn stop(s: &mut Session, a: &WatchArgs) -> Result<(), CliError> {
    for key in &a.keys {
        let request = Request::KeyNotify {
            key: key.as_bytes(),
            stop: true,
        };
        match s.call(&request, None).await?.response {
            // `:0`: the store had dropped the observation already.
            Response::Ok | Response::Integer(0) => {}
            Response::Error(e) => return Err(CliError::Store(e)),
            other => {
                return Err(CliError::BadResponse(format!(
                    "KEYNOTIFY STOP answered {other:?}"
                )))
            }
        }
    }
    Ok(())
}

fn print(s: &mut Session, format: Format, change: &Change) -> Result<(), CliError> {
    match format {
        Format::Json => {
            let mut o = serde_json::Map::new();
            put_bytes(&mut o, "key", &change.key);
            match &change.notification {
                Notification::Set(value) => {
                    o.insert("event".into(), "set".into());
                    put_bytes(&mut o, "value", value);
                }
                Notification::Delete => {
                    o.insert("event".into(), "delete".into());
                }
            }
            if let Some(v) = &change.version {
                o.insert("version".into(), Value::from(v.as_str()));
            }
            s.out.json(o)
        }
        _ => match &change.notification {
            Notification::Set(value) => {
                s.out
                    .line(&format!("SET {} {}", escape(&change.key), escape(value)))
            }
            Notification::Delete => s.out.line(&format!("DELETE {}", escape(&change.key))),
        },
    }
}
