//! statehub's command-line client, the `kv`, `pub`, `sub` and `token` subcommands of
//! the `statehub` binary.
//!
//! It speaks MQTT 5 through statehub's own codec (`statehub-mqtt-codec`), so the binary
//! gains no dependency for it; docs/decisions/0002-cli-client.md says why not the AIO
//! SDK or rumqttc. What lives where:
//! - `connect`: the connection flags (`-h`, `-p`, `-u`, `-P`, `-i`, `-k`, `-L` /
//!   `STATEHUB_URL`); `client`: the MQTT connection.
//! - `store`: the state store client; `store::proto`: its wire format (topics, RESP,
//!   notifications, HLC), no I/O.
//! - `kv` and `watch`, `pubsub`, `token`, `health`: the subcommands; `output`: text, JSON and
//!   raw printing; `error`: failures and the documented exit codes.

mod client;
mod connect;
mod error;
mod health;
mod kv;
mod output;
mod pubsub;
mod signals;
mod store;
mod token;
mod watch;

use std::process::ExitCode;

use clap::Subcommand;

pub use error::Exit;

/// The client subcommands, flattened into the binary's own.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The state store: set, get, del, vdel, scan, watch
    Kv(kv::KvArgs),
    /// Publish a message (as mosquitto_pub)
    #[command(name = "pub", disable_help_flag = true)]
    Pub(pubsub::PubArgs),
    /// Subscribe and print messages (as mosquitto_sub)
    #[command(disable_help_flag = true)]
    Sub(pubsub::SubArgs),
    /// Mint a Web PubSub client access URL from a connection string
    Token(token::TokenArgs),
    /// GET the server's /healthz (exit 0 if it answers 2xx): a container's HEALTHCHECK
    Healthcheck(health::HealthArgs),
}

/// Runs a client subcommand; the exit code is one of [`Exit`]'s.
pub fn run(command: Command) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            output::note(&format!("cannot start the runtime: {e}"));
            return Exit::Transport.into();
        }
    };
    let result = runtime.block_on(async {
        match command {
            Command::Kv(args) => kv::run(args).await,
            Command::Pub(args) => pubsub::publish(args).await,
            Command::Sub(args) => pubsub::subscribe(args).await,
            Command::Token(args) => token::run(args),
            Command::Healthcheck(args) => health::run(args).await,
        }
    });
    match result {
        Ok(exit) => exit.into(),
        Err(e) => {
            output::note(&e.to_string());
            e.exit().into()
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: super::Command,
    }

    /// clap checks its definitions only when a command is parsed; this checks all.
    #[test]
    fn command_line_definitions_are_consistent() {
        Cli::command().debug_assert();
    }
}
