//! `statehub kv`: the state store's verbs, one request each (SCAN: one per page;
//! watch: KEYNOTIFY, the notifications, KEYNOTIFY STOP).

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::{Map, Value};

use crate::connect::{ConnectArgs, Endpoint};
use crate::error::{CliError, Exit};
use crate::output::{self, note, put_bytes, Format, JsonArg, Out, OutputArgs};
use crate::store::proto::{Condition, Hlc, Request, Response};
use crate::store::{Reply, StoreClient};
use crate::watch::WatchArgs;

/// The exit codes, shown by `statehub kv --help` (and in the README).
const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  not found: GET, DEL or VDEL of a key that does not exist
  2  usage: a wrong command line, URL or file
  3  refused: --nx/--nex not met, VDEL of another value, a stale fencing token,
     or the server refused the connection or the request
  4  transport: no connection, or it broke
  5  timeout: no answer within --timeout";

#[derive(Debug, Args)]
#[command(after_help = EXIT_CODES)]
pub struct KvArgs {
    #[command(subcommand)]
    pub verb: KvVerb,
}

#[derive(Debug, Subcommand)]
pub enum KvVerb {
    /// Set a key (exit 3 if --nx/--nex or fencing refused it)
    #[command(disable_help_flag = true)]
    Set(SetArgs),
    /// Print a key's value (exit 1 if there is none)
    #[command(disable_help_flag = true)]
    Get(GetArgs),
    /// Delete a key (exit 1 if there was none)
    #[command(disable_help_flag = true)]
    Del(DelArgs),
    /// Delete a key if it holds VALUE (exit 1 if there was none, 3 if it holds another)
    #[command(disable_help_flag = true)]
    Vdel(VdelArgs),
    /// List the keys matching a glob, page by page (`*`, `?`, `[ab]`, `[!0-9]`)
    #[command(disable_help_flag = true)]
    Scan(ScanArgs),
    /// Print changes to keys (SET, DELETE) until Ctrl-C or --count
    #[command(disable_help_flag = true)]
    Watch(WatchArgs),
}

#[derive(Debug, Args)]
pub struct SetArgs {
    /// The key
    key: OsString,
    /// The value (or -f FILE, or -s to read standard input)
    #[arg(required_unless_present_any = ["file", "stdin"])]
    value: Option<OsString>,
    /// Read the value from FILE
    #[arg(short = 'f', long, value_name = "FILE", conflicts_with_all = ["value", "stdin"])]
    file: Option<PathBuf>,
    /// Read the value from standard input
    #[arg(short = 's', long, conflicts_with = "value")]
    stdin: bool,
    /// Only if the key does not exist
    #[arg(long, conflicts_with = "nex")]
    nx: bool,
    /// Only if the key does not exist or already holds this value (how leases renew)
    #[arg(long)]
    nex: bool,
    /// Expire the key after MS milliseconds
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    px: Option<u64>,
    #[command(flatten)]
    fencing: FencingArg,
    #[command(flatten)]
    output: JsonArg,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Debug, Clone, Args)]
pub struct FencingArg {
    /// Fencing token (an HLC version such as a lease's, 001700000000000:00000:node)
    #[arg(long, value_name = "HLC", value_parser = parse_hlc)]
    fencing_token: Option<Hlc>,
}

impl FencingArg {
    fn get(&self) -> Option<&Hlc> {
        self.fencing_token.as_ref()
    }
}

fn parse_hlc(s: &str) -> Result<Hlc, String> {
    Hlc::parse(s).ok_or_else(|| "expected <ms since epoch>:<counter>:<node id>".to_owned())
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// The key
    key: OsString,
    #[command(flatten)]
    output: OutputArgs,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Debug, Args)]
pub struct DelArgs {
    /// The key
    key: OsString,
    #[command(flatten)]
    fencing: FencingArg,
    #[command(flatten)]
    output: JsonArg,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Debug, Args)]
pub struct VdelArgs {
    /// The key
    key: OsString,
    /// The value the key must hold
    value: OsString,
    #[command(flatten)]
    fencing: FencingArg,
    #[command(flatten)]
    output: JsonArg,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Debug, Args)]
pub struct ScanArgs {
    /// The glob keys must match
    #[arg(default_value = "*")]
    pattern: OsString,
    /// Stop after N keys
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    #[command(flatten)]
    output: JsonArg,
    #[command(flatten)]
    connect: ConnectArgs,
}

/// Runs one `kv` verb.
pub async fn run(args: KvArgs) -> Result<Exit, CliError> {
    let (connect, format) = match &args.verb {
        KvVerb::Set(a) => (&a.connect, a.output.format()),
        KvVerb::Get(a) => (&a.connect, a.output.format()),
        KvVerb::Del(a) => (&a.connect, a.output.format()),
        KvVerb::Vdel(a) => (&a.connect, a.output.format()),
        KvVerb::Scan(a) => (&a.connect, a.output.format()),
        KvVerb::Watch(a) => return crate::watch::run(a).await,
    };
    // Read before connecting: a missing file is a usage error, not a half-done request.
    let value = match &args.verb {
        KvVerb::Set(a) => set_value(a)?,
        _ => Vec::new(),
    };
    let mut s = open(connect, "kv").await?;
    let result = match &args.verb {
        KvVerb::Set(a) => set(&mut s, format, a, &value).await,
        KvVerb::Get(a) => get(&mut s, format, a).await,
        KvVerb::Del(a) => delete(&mut s, format, &a.key, None, a.fencing.get()).await,
        KvVerb::Vdel(a) => delete(&mut s, format, &a.key, Some(&a.value), a.fencing.get()).await,
        KvVerb::Scan(a) => scan(&mut s, format, a).await,
        KvVerb::Watch(_) => Ok(Exit::Success),
    };
    s.finish(format, result).await
}

/// A store session: what the command's requests need.
#[derive(Debug)]
pub struct Session {
    pub store: StoreClient,
    pub endpoint: Endpoint,
    pub out: Out,
}

/// Connects and opens the state store client.
pub async fn open(connect: &ConnectArgs, command: &str) -> Result<Session, CliError> {
    let endpoint = connect.resolve(command)?;
    let mqtt = crate::client::Client::connect(&endpoint).await?;
    if endpoint.debug {
        note(&format!(
            "connected to {} as {}",
            endpoint.address(),
            mqtt.client_id()
        ));
    }
    let store = StoreClient::open(mqtt).await?;
    Ok(Session {
        store,
        endpoint,
        out: Out::new(),
    })
}

impl Session {
    /// Reports a store refusal in JSON when asked, and disconnects.
    pub async fn finish(
        mut self,
        format: Format,
        result: Result<Exit, CliError>,
    ) -> Result<Exit, CliError> {
        if let (Err(CliError::Store(message)), Format::Json) = (&result, format) {
            let mut o = Map::new();
            o.insert("result".into(), "error".into());
            o.insert("error".into(), Value::from(message.as_str()));
            self.out.json(o)?;
        }
        self.store.close().await;
        result
    }

    pub async fn call(
        &mut self,
        request: &Request<'_>,
        fencing: Option<&Hlc>,
    ) -> Result<Reply, CliError> {
        let timeout = self.endpoint.timeout;
        self.store.call(request, fencing, timeout).await
    }
}

fn set_value(a: &SetArgs) -> Result<Vec<u8>, CliError> {
    if let Some(v) = &a.value {
        return Ok(v.as_bytes().to_vec());
    }
    if let Some(path) = &a.file {
        return std::fs::read(path)
            .map_err(|e| CliError::usage(format!("cannot read {}: {e}", path.display())));
    }
    let mut value = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut value)
        .map_err(|e| CliError::usage(format!("cannot read standard input: {e}")))?;
    Ok(value)
}

fn keyed(key: &[u8]) -> Map<String, Value> {
    let mut o = Map::new();
    put_bytes(&mut o, "key", key);
    o
}

fn unexpected(what: &str, response: &Response) -> CliError {
    CliError::BadResponse(format!("{what} answered {response:?}"))
}

async fn set(s: &mut Session, f: Format, a: &SetArgs, value: &[u8]) -> Result<Exit, CliError> {
    let key = a.key.as_bytes();
    let condition = match (a.nx, a.nex) {
        (true, _) => Condition::NotExists,
        (_, true) => Condition::NotExistsOrEqual,
        _ => Condition::Always,
    };
    let request = Request::Set {
        key,
        value,
        condition,
        px_ms: a.px,
    };
    let reply = s.call(&request, a.fencing.get()).await?;
    let (result, exit) = match &reply.response {
        Response::Ok => ("ok", Exit::Success),
        Response::Integer(-1) => ("not_set", Exit::Refused),
        Response::Error(e) => return Err(CliError::Store(e.clone())),
        other => return Err(unexpected("SET", other)),
    };
    match f {
        Format::Json => {
            let mut o = keyed(key);
            o.insert("result".into(), result.into());
            if let Some(v) = &reply.version {
                o.insert("version".into(), Value::from(v.as_str()));
            }
            s.out.json(o)?;
        }
        _ if exit == Exit::Success => s.out.line("OK")?,
        _ => note(&format!(
            "not set: {} {}",
            output::escape(key),
            if a.nx {
                "exists (--nx)"
            } else {
                "holds another value (--nex)"
            }
        )),
    }
    Ok(exit)
}

async fn get(s: &mut Session, f: Format, a: &GetArgs) -> Result<Exit, CliError> {
    let key = a.key.as_bytes();
    let reply = s.call(&Request::Get { key }, None).await?;
    let value = match reply.response {
        Response::Bulk(v) => Some(v),
        Response::Null => None,
        Response::Error(e) => return Err(CliError::Store(e)),
        other => return Err(unexpected("GET", &other)),
    };
    match (f, &value) {
        (Format::Json, _) => {
            let mut o = keyed(key);
            o.insert("found".into(), value.is_some().into());
            if let Some(v) = &value {
                put_bytes(&mut o, "value", v);
            }
            if let (Some(version), Some(_)) = (&reply.version, &value) {
                o.insert("version".into(), Value::from(version.as_str()));
            }
            s.out.json(o)?;
        }
        (Format::Raw, Some(v)) => s.out.write(v)?,
        (Format::Text, Some(v)) => s.out.line(&output::escape(v))?,
        (_, None) => note(&format!("not found: {}", output::escape(key))),
    }
    Ok(if value.is_some() {
        Exit::Success
    } else {
        Exit::NotFound
    })
}

async fn delete(
    s: &mut Session,
    f: Format,
    key: &OsString,
    value: Option<&OsString>,
    fencing: Option<&Hlc>,
) -> Result<Exit, CliError> {
    let key = key.as_bytes();
    let request = match value {
        Some(value) => Request::VDel {
            key,
            value: value.as_bytes(),
        },
        None => Request::Del { key },
    };
    let verb = if value.is_some() { "VDEL" } else { "DEL" };
    let reply = s.call(&request, fencing).await?;
    let (result, exit) = match reply.response {
        Response::Integer(1) => ("deleted", Exit::Success),
        Response::Integer(0) => ("not_found", Exit::NotFound),
        Response::Integer(-1) if value.is_some() => ("mismatch", Exit::Refused),
        Response::Error(e) => return Err(CliError::Store(e)),
        other => return Err(unexpected(verb, &other)),
    };
    match (f, exit) {
        (Format::Json, _) => {
            let mut o = keyed(key);
            o.insert("result".into(), result.into());
            s.out.json(o)?;
        }
        (_, Exit::Success) => s.out.line("deleted")?,
        (_, Exit::NotFound) => note(&format!("not found: {}", output::escape(key))),
        _ => note(&format!(
            "not deleted: {} holds another value",
            output::escape(key)
        )),
    }
    Ok(exit)
}

async fn scan(s: &mut Session, f: Format, a: &ScanArgs) -> Result<Exit, CliError> {
    let pattern = a.pattern.as_bytes();
    let mut token: Option<bytes::Bytes> = None;
    let mut printed = 0u64;
    loop {
        let request = Request::Scan {
            pattern,
            token: token.as_deref(),
        };
        let (keys, next) = match s.call(&request, None).await?.response {
            Response::Scan { keys, token } => (keys, token),
            Response::Error(e) => return Err(CliError::Store(e)),
            other => return Err(unexpected("SCAN", &other)),
        };
        for key in keys {
            if a.limit.is_some_and(|limit| printed >= limit) || s.out.closed() {
                return Ok(Exit::Success);
            }
            match f {
                Format::Json => s.out.json(keyed(&key))?,
                _ => s.out.line(&output::escape(&key))?,
            }
            printed += 1;
        }
        match next {
            Some(next) if a.limit.is_none_or(|limit| printed < limit) => token = Some(next),
            _ => return Ok(Exit::Success),
        }
    }
}
