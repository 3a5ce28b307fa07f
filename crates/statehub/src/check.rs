//! `statehub check-config`: loads the configuration exactly as `serve` would (the same
//! flags, environment and file, every table checked), says whether it is valid, and
//! prints what a given principal may do under its authorization rules. Exit 0 when
//! valid, 2 when not (as `serve` exits on a bad configuration).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;

use statehub_authz::Principal;

use crate::config::{ServeArgs, Settings};

/// `statehub check-config` flags.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Everything `serve` takes; `--config FILE` is the file checked.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Print the grants of the client with this id.
    #[arg(long)]
    pub client_id: Option<String>,
    /// ... authenticated with this user name.
    #[arg(long, requires = "client_id")]
    pub username: Option<String>,
    /// ... with this authorization attribute (`name=value`; repeat for more).
    #[arg(long = "attribute", value_parser = attribute, requires = "client_id")]
    pub attributes: Vec<(String, String)>,
}

fn attribute(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{text:?} is not name=value")),
    }
}

/// Runs the check; the report goes to stdout, errors to the log (stderr).
pub fn run(args: &CheckArgs) -> ExitCode {
    let Some(path) = &args.serve.config else {
        tracing::error!("check-config needs --config FILE (or STATEHUB_CONFIG)");
        return ExitCode::from(2);
    };
    let settings = match Settings::resolve(&args.serve) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut out = format!(
        "{}: valid\n{}\n",
        path.display(),
        settings.authorization.summary()
    );
    if let Some(client_id) = &args.client_id {
        let attributes: BTreeMap<String, String> = args.attributes.iter().cloned().collect();
        let who = Principal {
            client_id,
            username: args.username.as_deref(),
            attributes: &attributes,
        };
        out.push_str(&grants(&settings, &who));
    }
    // The report is the command's output, for a person or a script: stdout.
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("cannot write the report: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What `who` may do, one section per method.
fn grants(settings: &Settings, who: &Principal<'_>) -> String {
    let mut out = format!(
        "\nclient id {:?}, username {:?}, attributes {:?}:\n",
        who.client_id, who.username, who.attributes
    );
    let Some(policy) = &settings.authorization.policy else {
        out.push_str("  everything (no rules), but what the built-in protections refuse\n");
        out.push_str(BUILT_IN);
        return out;
    };
    let d = policy.access(who).describe();
    let connect = if d.connect { "allowed" } else { "denied" };
    out.push_str(&format!("  connect: {connect}\n"));
    let sections = [
        ("publish (topic filters)", &d.publish),
        ("subscribe (filters inside these)", &d.subscribe),
        ("state store read: GET, KEYNOTIFY, SCAN (keys)", &d.read),
        ("state store write: SET, DEL, VDEL (keys)", &d.write),
    ];
    for (title, items) in sections {
        out.push_str(&format!("  {title}:"));
        if items.is_empty() {
            out.push_str(" nothing\n");
            continue;
        }
        out.push('\n');
        for item in items {
            out.push_str(&format!("    {item}\n"));
        }
    }
    out.push_str(BUILT_IN);
    out
}

const BUILT_IN: &str = "  built-in, whatever the rules: no PUBLISH on $ topics or on state store \
notification topics; no PUBLISH on, or SUBSCRIBE to, another client's state store response \
or notification topics\n";
