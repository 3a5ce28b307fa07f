//! `statehub-bench`: load generator and latency benchmark for statehub.
//!
//! Scenarios are subcommands; each lives in its own module and produces a
//! [`report::Report`], which is printed human-readable and, with `--json`, as one
//! JSON line on stdout for scripts. Scenarios: `mqtt` (publish/subscribe fan-out
//! over MQTT 3.1.1 or 5.0, against any broker), `statestore` (SET/GET requests
//! to the Azure IoT Operations state store, as the SDKs send them) and `fanout`
//! (reliable WebSocket fan-out: statehub's Web PubSub vs a Socket.IO server) and
//! `idle` (many idle connections, for memory per connection). New scenarios
//! add a module, a variant of [`Command`] and a match arm in [`main`].

mod common;
mod fanout;
mod idle;
mod mqtt;
mod proto;
mod report;
mod statestore;

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "statehub-bench",
    version,
    about = "Benchmarks for statehub (and other MQTT brokers)"
)]
struct Cli {
    /// Tokio worker threads for the benchmark itself (default: the CPUs this
    /// process may run on; 1 means a single-threaded runtime).
    #[arg(long, global = true)]
    threads: Option<usize>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// MQTT publish/subscribe throughput and end-to-end latency.
    Mqtt(mqtt::MqttArgs),
    /// Azure IoT Operations state store SET/GET throughput and request latency,
    /// over MQTT 5 as the SDKs call it.
    Statestore(statestore::StateStoreArgs),
    /// Reliable fan-out (1 publisher, 1 group, N subscribers) over Web PubSub's
    /// reliable JSON subprotocol or Socket.IO.
    Fanout(fanout::FanoutArgs),
    /// Many idle connections (MQTT, Web PubSub or Socket.IO), held open so that a
    /// script can read the server's memory per connection.
    Idle(idle::IdleArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let threads = cli
        .threads
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
        .max(1);
    let runtime = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("statehub-bench: cannot start the tokio runtime: {e}");
            return ExitCode::from(2);
        }
    };

    let (result, json) = match cli.command {
        Command::Mqtt(args) => {
            let json = args.json;
            (runtime.block_on(mqtt::run(args)), json)
        }
        Command::Statestore(args) => {
            let json = args.json;
            (runtime.block_on(statestore::run(args)), json)
        }
        Command::Fanout(args) => {
            let json = args.json;
            (runtime.block_on(fanout::run(args)), json)
        }
        Command::Idle(args) => {
            let json = args.json;
            (runtime.block_on(idle::run(args)), json)
        }
    };
    // Do not wait for stragglers (tasks of timed-out connections).
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));

    match result {
        Ok(report) => {
            let human = report.human();
            if json {
                // Human-readable on stderr, one JSON line on stdout.
                let _ = std::io::stderr().write_all(human.as_bytes());
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{}", report.json());
            } else {
                let _ = std::io::stdout().write_all(human.as_bytes());
            }
            let _ = std::io::stdout().flush();
            ExitCode::from(report.exit_code())
        }
        Err(e) => {
            eprintln!("statehub-bench: {e}");
            ExitCode::from(2)
        }
    }
}
