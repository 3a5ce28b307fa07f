//! The log's format: text for people (ANSI colours only on a terminal that allows them)
//! or one JSON object per line for log collectors (`--log-format json`, as containers
//! are usually run).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// `--log-format`, accepted before or after the subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log format on stderr: `text` (colours only on a terminal, never with NO_COLOR
    /// set) or `json` (one object per line). The level comes from RUST_LOG (default info).
    #[arg(
        long,
        global = true,
        env = "STATEHUB_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Installs the process's log subscriber.
pub fn init(args: &LogArgs) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_ansi(colours()).init(),
    }
}

/// Colours only where a person reads them: stderr is a terminal and NO_COLOR is unset
/// (or empty, as no-color.org says).
fn colours() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}
