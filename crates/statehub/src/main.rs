//! The `statehub` binary: parses settings, starts the MQTT and HTTP listeners, and
//! turns SIGINT/SIGTERM into one shutdown signal fanned out to every task.

mod config;
mod http;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use statehub_broker::{Broker, MqttListener};
use statehub_state_store_service::{StateStoreService, REQUEST_TOPIC};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

use config::{ServeArgs, Settings};

#[derive(Debug, Parser)]
#[command(name = "statehub", version, about = "MQTT 5 broker with a built-in state store")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server.
    Serve(ServeArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let Command::Serve(args) = cli.command;
    let settings = match Settings::resolve(&args) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(settings: Settings) -> std::io::Result<()> {
    // Installed before anything is bound, so a signal sent as soon as the
    // "listening" lines appear is always a graceful shutdown.
    let mut signals = Signals::install()?;
    let broker = Broker::new(settings.broker.clone());
    let shutdown = broker.shutdown_token();
    let store = StateStoreService::in_memory(&settings.state_store)
        .map(Arc::new)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    broker.register_service(REQUEST_TOPIC, store.clone());
    let expiry = tokio::spawn(store.run_expiry(broker.clone()));
    let workers = Workers::start(settings.mqtt_threads)?;
    let mqtt = MqttListener::bind(broker.clone(), settings.mqtt_listen).await?.with_workers(workers.handles());
    let http = TcpListener::bind(settings.http_listen).await?;
    tracing::info!("mqtt listening on {}", mqtt.local_addr()?);
    tracing::info!("http listening on {}", http.local_addr()?);

    let signals = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            signals.recv().await;
            tracing::info!("shutdown requested");
            shutdown.cancel();
        }
    });
    let grace = Duration::from_secs(settings.shutdown_grace_secs);
    let (router, wps) = http::router(settings.webpubsub.clone(), http.local_addr()?);
    let wps_task = match wps {
        Some(wps) => {
            tracing::info!("web pubsub client endpoint on /client/hubs/{{hub}}, REST API on /api/hubs/{{hub}}");
            let shutdown = shutdown.clone();
            Some(tokio::spawn(async move {
                shutdown.cancelled().await;
                wps.shutdown(grace).await;
            }))
        }
        None => {
            tracing::info!("web pubsub is off: no access key configured (--access-key, STATEHUB_ACCESS_KEYS or [webpubsub] access_keys); without a key no token can be valid");
            None
        }
    };
    let http_task = tokio::spawn(http::serve(http, router, shutdown.clone()));
    mqtt.serve(grace).await;
    if let Some(task) = wps_task {
        if let Err(e) = task.await {
            tracing::error!("web pubsub shutdown failed: {e}");
        }
    }
    signals.abort();
    workers.stop();
    expiry.abort();
    match http_task.await {
        Ok(r) => r?,
        Err(e) => tracing::error!("http task failed: {e}"),
    }
    tracing::info!("stopped");
    Ok(())
}

/// One single-threaded runtime per MQTT worker thread (see
/// `MqttListener::with_workers` for why), each parked on a stop token.
struct Workers {
    handles: Vec<tokio::runtime::Handle>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stop: tokio_util::sync::CancellationToken,
}

impl Workers {
    fn start(n: usize) -> std::io::Result<Workers> {
        let stop = tokio_util::sync::CancellationToken::new();
        let mut handles = Vec::with_capacity(n);
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            handles.push(rt.handle().clone());
            let stop = stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("mqtt-worker-{i}"))
                .spawn(move || rt.block_on(stop.cancelled()))?;
            threads.push(thread);
        }
        Ok(Workers { handles, threads, stop })
    }

    fn handles(&self) -> Vec<tokio::runtime::Handle> {
        self.handles.clone()
    }

    /// Stops the worker runtimes (after the listener drained its connections).
    fn stop(self) {
        self.stop.cancel();
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// SIGINT and SIGTERM, registered with the runtime at construction.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals { interrupt: signal(SignalKind::interrupt())?, terminate: signal(SignalKind::terminate())? })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}
