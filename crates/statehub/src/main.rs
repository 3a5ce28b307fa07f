//! The `statehub` binary: parses settings, starts the MQTT and HTTP listeners, and
//! turns SIGINT/SIGTERM into one shutdown signal fanned out to every task; or runs one
//! of the client subcommands (`kv`, `pub`, `sub`, `token`: the `statehub-cli` crate).

mod admin;
mod auth_config;
mod authz;
mod check;
mod cluster;
mod cluster_mqtt;
mod config;
mod fds;
mod first_use;
mod http;
mod listeners;
mod logging;
mod metrics;
mod passwd;

use std::error::Error;
use std::fmt::Debug;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use statehub_broker::Broker;
use statehub_broker_durable::SessionTable;
use statehub_state_store_service::{DurableEngine, StateStoreService, REQUEST_TOPIC};
use statehub_storage::{Options, Store};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use config::{ServeArgs, Settings};

/// mimalloc instead of glibc's malloc: the fan-out and request paths allocate and
/// free many short-lived buffers across threads, where glibc spent about a third of
/// the server's CPU (perf, reliable fan-out to 1,000 subscribers).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "statehub",
    version,
    about = "MQTT 5 broker with a built-in state store"
)]
struct Cli {
    #[command(flatten)]
    log: logging::LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Add, change or delete a user in a Mosquitto-format password file.
    Passwd(passwd::PasswdArgs),
    /// Repair a data directory that `serve` refuses as damaged: keep every intact batch
    /// and snapshot block, report every one that is lost, and move the files it replaces
    /// to DIR/damaged/repair-*/ (nothing is deleted). Run it with the server stopped.
    Repair(RepairArgs),
    /// Check a configuration as `serve` would load it (exit 2 if invalid), and print
    /// what a client may do under its authorization rules (--client-id, --username,
    /// --attribute name=value).
    CheckConfig(check::CheckArgs),
    #[command(flatten)]
    Client(statehub_cli::Command),
}

/// `statehub repair` flags.
#[derive(Debug, clap::Args)]
struct RepairArgs {
    /// The data directory to repair.
    #[arg(long)]
    data_dir: std::path::PathBuf,
    /// Report what a repair would keep and lose, and change nothing.
    #[arg(long)]
    dry_run: bool,
}

fn main() -> ExitCode {
    let cli: Cli = first_use::parse();
    logging::init(&cli.log);
    let args = match cli.command {
        Command::Serve(args) => args,
        Command::Passwd(args) => return passwd::run(&args),
        Command::Repair(args) => return repair(&args),
        Command::CheckConfig(args) => return check::run(&args),
        Command::Client(command) => return statehub_cli::run(command),
    };
    let settings = match Settings::resolve(&args) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
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

/// `statehub repair`: the report on stdout; exit 0 once repaired (losses or not), 1 if
/// the repair could not be made.
fn repair(args: &RepairArgs) -> ExitCode {
    match statehub_storage::repair(&args.data_dir, args.dry_run) {
        Ok(report) => {
            use std::io::Write;
            // The report is the command's output, for a person or a script: stdout.
            match write!(std::io::stdout().lock(), "{report}") {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("cannot write the repair report: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            tracing::error!("{}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

async fn serve(mut settings: Settings) -> std::io::Result<()> {
    // Installed before anything is bound, so a signal sent as soon as the
    // "listening" lines appear is always a graceful shutdown.
    let signals = Signals::install()?;
    let rules = authz::Reloader::install(settings.config.clone())?;
    let descriptors = fds::Descriptors::raise();
    descriptors.size_connections(&mut settings);
    // These errors say their cause (the file and what is wrong with it) themselves.
    let invalid =
        |e: &dyn Error| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string());
    let mut security =
        listeners::Security::load(&settings.authentication).map_err(|e| invalid(&e))?;
    let broker = start_broker(&settings, rules);
    let shutdown = broker.shutdown_token();
    let cluster_metrics = metrics::ClusterSources::default();
    let (expiry, storage, state_store) = start_state_store(&settings, &broker, &cluster_metrics)?;
    let mqtt_fabric = cluster_mqtt::start(settings.cluster.as_ref(), &broker, &cluster_metrics)?;
    let workers = Workers::start(settings.mqtt_threads)?;
    let mqtt = listeners::bind(
        &broker,
        &settings.mqtt_listeners,
        &mut security,
        &workers.handles(),
    )
    .await
    .map_err(|e| invalid(&e))?;
    let (http, http_tls) = bind_http(&settings, &mut security).await?;
    let client_certs = settings
        .http
        .tls
        .as_ref()
        .is_some_and(|t| t.client_ca.is_some());
    let ws_auth = security.websocket_auth(&settings.mqtt_listeners, client_certs);
    let reloader = security.spawn_reloader(shutdown.clone());
    let signals = tokio::spawn(signals.cancel_on_signal(shutdown.clone()));
    let grace = Duration::from_secs(settings.shutdown_grace_secs);
    let (router, wps) = http::router(settings.webpubsub.clone(), http.local_addr()?);
    cluster::start_webpubsub(settings.cluster.as_ref(), wps.as_ref(), &cluster_metrics)?;
    let telemetry = metrics::Telemetry::new(
        broker.clone(),
        state_store,
        storage.as_ref().map(|d| d.store.clone()),
        wps.clone(),
        settings.http.metrics_token.clone(),
        cluster_metrics,
    );
    let router = router.merge(telemetry.routes()).merge(admin::router(
        &settings.admin,
        broker.clone(),
        wps.clone(),
    ));
    let wps_task = http::shut_down_with(wps, shutdown.clone(), grace);
    let router = if settings.http.mqtt_websocket {
        http::mqtt_ws::mount(router, &broker, workers.handles(), ws_auth)
    } else {
        router
    };
    let http_limits = http::Limits::new(&settings.http, descriptors.per_listener());
    // Every listener is bound and the data directory is loaded: ready before the first
    // HTTP request can be served.
    telemetry.set_ready(true);
    let http_task = tokio::spawn(http::serve(
        http,
        router,
        http_limits,
        http_tls,
        shutdown.clone(),
    ));
    let unready = on_shutdown(&shutdown, move || telemetry.set_ready(false));
    serve_mqtt(mqtt, grace).await;
    Stopping {
        aborted: [unready, reloader, signals, expiry],
        wps_task,
        workers,
        mqtt_fabric,
        storage,
        http_task,
        grace,
    }
    .finish()
    .await
}

/// What runs once the MQTT listeners have stopped, ended in the order that leaves
/// nothing half written: Web PubSub's hand-over first, then the MQTT workers, then
/// what the persistent sessions still hold back, then the data directory.
struct Stopping {
    aborted: [JoinHandle<()>; 4],
    wps_task: Option<JoinHandle<()>>,
    workers: Workers,
    mqtt_fabric: Option<statehub_broker_redis::RedisFabric>,
    storage: Option<DataDir>,
    http_task: JoinHandle<std::io::Result<()>>,
    grace: Duration,
}

impl Stopping {
    async fn finish(self) -> std::io::Result<()> {
        for task in self.aborted {
            task.abort();
        }
        if let Some(task) = self.wps_task {
            if let Err(e) = task.await {
                tracing::error!("web pubsub shutdown failed: {e}");
            }
        }
        self.workers.stop();
        cluster_mqtt::flush_sessions(self.mqtt_fabric.as_ref(), self.grace).await;
        if let Some(data_dir) = self.storage {
            data_dir.close();
        }
        match self.http_task.await {
            Ok(r) => r?,
            Err(e) => tracing::error!("http task failed: {e}"),
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// The broker, with the authorization rules installed and reloaded by `rules`.
fn start_broker(settings: &Settings, rules: authz::Reloader) -> Broker {
    let broker = Broker::new(settings.broker.clone());
    statehub_broker::sys::spawn(&broker, concat!("statehub ", env!("CARGO_PKG_VERSION")));
    broker.set_policy(settings.authorization.policy.clone());
    tracing::info!("{}", settings.authorization.summary());
    tokio::spawn(rules.run(broker.clone(), broker.shutdown_token()));
    broker
}

/// Binds the HTTP listener, with its TLS configuration if it has one.
async fn bind_http(
    settings: &Settings,
    security: &mut listeners::Security,
) -> std::io::Result<(TcpListener, Option<Arc<dyn statehub_broker::TlsSource>>)> {
    let http = TcpListener::bind(settings.http_listen)
        .await
        .map_err(|e| first_use::bind_error("HTTP", settings.http_listen, e))?;
    let tls = security
        .http_tls(settings.http.tls.as_ref())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    let with_tls = if tls.is_some() { " with TLS" } else { "" };
    tracing::info!("http listening on {}{with_tls}", http.local_addr()?);
    Ok((http, tls))
}

/// Runs `f` once `shutdown` is cancelled.
fn on_shutdown(shutdown: &CancellationToken, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        shutdown.cancelled().await;
        f();
    })
}

/// Serves every MQTT listener until shutdown, each waiting up to `grace` for its
/// connections to close.
async fn serve_mqtt(listeners: Vec<statehub_broker::MqttListener>, grace: Duration) {
    let serving: Vec<_> = listeners
        .into_iter()
        .map(|l| tokio::spawn(l.serve(grace)))
        .collect();
    for listener in serving {
        if let Err(e) = listener.await {
            tracing::error!("mqtt listener failed: {e}");
        }
    }
}

/// `error: source: source...`, the whole story in one line. A source whose message the
/// text already ends with (an error that prints its source and also returns it) is not
/// repeated.
fn chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let next = e.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = e.source();
    }
    text
}

/// The state store, in memory or loaded from `--data-dir`, registered on the broker with
/// its expiry task running; with a data directory, the broker's retained messages are
/// loaded from it and kept there too. Returns the task, the open data directory and the
/// service (for the metrics).
fn start_state_store(
    settings: &Settings,
    broker: &Broker,
    cluster_metrics: &metrics::ClusterSources,
) -> std::io::Result<(JoinHandle<()>, Option<DataDir>, StateStoreRef)> {
    let invalid = |e: &dyn Error| std::io::Error::new(std::io::ErrorKind::InvalidInput, chain(e));
    if let Some(cluster) = &settings.cluster {
        let (expiry, service) = cluster::start_state_store(
            &cluster.store,
            &settings.state_store,
            broker,
            cluster_metrics,
        )?;
        return Ok((expiry, None, service));
    }
    let Some(dir) = &settings.data_dir else {
        let service =
            StateStoreService::in_memory(&settings.state_store).map_err(|e| invalid(&e))?;
        let (expiry, service) = register(broker, service);
        return Ok((expiry, None, service));
    };
    let started = Instant::now();
    let options = Options {
        sync: settings.sync,
        compact_after_bytes: settings.compact_after_bytes,
        max_journal_bytes: settings.max_journal_bytes,
        ..Options::default()
    };
    first_use::check_data_dir(dir)?;
    let store = Store::open(dir, options).map_err(|e| std::io::Error::other(chain(&e)))?;
    let engine = DurableEngine::open(&store).map_err(|e| {
        std::io::Error::other(format!(
            "cannot load the state store from {}: {}",
            dir.display(),
            chain(&e)
        ))
    })?;
    let service = StateStoreService::open_durable(&settings.state_store, engine)
        .map_err(|e| std::io::Error::other(chain(&e)))?;
    let installed = statehub_broker_durable::install(broker, &store)
        .map_err(|e| std::io::Error::other(chain(&e)))?;
    tracing::info!(
        "state store loaded from {}: {} keys, {} retained messages and {} persistent sessions in {} ms (sync {})",
        dir.display(),
        service.stats().keys,
        installed.retained_messages,
        installed.persistent_sessions,
        started.elapsed().as_millis(),
        settings.sync
    );
    let (expiry, service) = register(broker, service);
    let data_dir = DataDir::start(store, installed.sessions);
    Ok((expiry, Some(data_dir), service))
}

/// The state store service, whatever its engine, as the metrics read it.
type StateStoreRef = Arc<dyn metrics::StateStoreSource>;

fn register<E, A>(
    broker: &Broker,
    service: StateStoreService<E, A>,
) -> (JoinHandle<()>, StateStoreRef)
where
    E: statehub_state_store_service::Engine + Send + Debug + 'static,
    A: statehub_state_store_service::Authorizer + Send + Debug + 'static,
{
    register_shared(broker, Arc::new(service))
}

/// [`register`] for a service the caller shares with other tasks.
fn register_shared<E, A>(
    broker: &Broker,
    service: Arc<StateStoreService<E, A>>,
) -> (JoinHandle<()>, StateStoreRef)
where
    E: statehub_state_store_service::Engine + Send + Debug + 'static,
    A: statehub_state_store_service::Authorizer + Send + Debug + 'static,
{
    broker.register_service(REQUEST_TOPIC, service.clone());
    let expiry = tokio::spawn(service.clone().run_expiry(broker.clone()));
    (expiry, service)
}

/// The open data directory: its store, and the session table whose write-behind
/// messages a background task writes out.
struct DataDir {
    store: Store,
    sessions: Arc<SessionTable>,
    flusher: JoinHandle<()>,
}

impl DataDir {
    fn start(store: Store, sessions: Arc<SessionTable>) -> DataDir {
        let flusher = tokio::spawn(sessions.clone().run_flusher());
        DataDir {
            store,
            sessions,
            flusher,
        }
    }

    /// Writes what is held, then closes the store (which commits and syncs it all).
    fn close(self) {
        self.flusher.abort();
        self.sessions.flush_all();
        if let Err(e) = self.store.close() {
            tracing::error!("closing the data directory: {}", chain(&e));
        }
    }
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
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(rt.handle().clone());
            let stop = stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("mqtt-worker-{i}"))
                .spawn(move || rt.block_on(stop.cancelled()))?;
            threads.push(thread);
        }
        Ok(Workers {
            handles,
            threads,
            stop,
        })
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
    /// Cancels `shutdown` at the first SIGINT or SIGTERM.
    async fn cancel_on_signal(mut self, shutdown: CancellationToken) {
        self.recv().await;
        tracing::info!("shutdown requested");
        shutdown.cancel();
    }

    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}
