//! `statehub token`: a Web PubSub client access URL, minted from a connection string
//! as the server SDKs' `getClientAccessToken` does.

use std::time::Duration;

use clap::Args;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde_json::{Map, Value};
use statehub_webpubsub::{issue_client_token, ClientClaims};

use crate::error::{CliError, Exit};
use crate::output::Out;

#[derive(Debug, Args)]
pub struct TokenArgs {
    /// The hub the client connects to
    #[arg(long)]
    hub: String,
    /// The user id (`sub`)
    #[arg(long, value_name = "USER")]
    user: Option<String>,
    /// A role, e.g. webpubsub.joinLeaveGroup or webpubsub.sendToGroup.<group> (repeatable)
    #[arg(long = "role", value_name = "ROLE")]
    roles: Vec<String>,
    /// A group joined on connect (repeatable)
    #[arg(long = "group", value_name = "GROUP")]
    groups: Vec<String>,
    /// Lifetime: seconds, or a number with s, m, h or d
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    expires_in: Duration,
    /// Endpoint=http://host:port;AccessKey=KEY;Version=1.0;
    #[arg(
        long,
        env = "STATEHUB_CONNECTION_STRING",
        hide_env_values = true,
        value_name = "CONNECTION_STRING"
    )]
    connection_string: String,
    /// Print {"url", "token", "expires_in"} as JSON
    #[arg(long)]
    json: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| "expected a number of seconds, or 30m, 12h, 7d".to_owned())?;
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("unknown unit {unit:?}: use s, m, h or d")),
    };
    match n.checked_mul(unit) {
        Some(secs) if secs > 0 => Ok(Duration::from_secs(secs)),
        _ => Err("must be at least one second".to_owned()),
    }
}

/// What a connection string holds.
#[derive(Debug, PartialEq, Eq)]
struct ConnectionString {
    /// `http(s)://host[:port]`, no trailing slash.
    endpoint: String,
    access_key: String,
}

fn parse_connection_string(s: &str) -> Result<ConnectionString, CliError> {
    let bad = |why: &str| CliError::usage(format!("connection string: {why}"));
    let (mut endpoint, mut key, mut port) = (None, None, None);
    for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = part
            .split_once('=')
            .ok_or_else(|| bad(&format!("{part:?} is not NAME=VALUE")))?;
        match name.trim().to_ascii_lowercase().as_str() {
            "endpoint" => endpoint = Some(value.trim().trim_end_matches('/').to_owned()),
            "accesskey" => key = Some(value.trim().to_owned()),
            "port" => {
                port = Some(
                    value
                        .trim()
                        .parse::<u16>()
                        .map_err(|_| bad("Port is not a port number"))?,
                )
            }
            _ => {}
        }
    }
    let mut endpoint = endpoint.ok_or_else(|| bad("no Endpoint=http(s)://host[:port]"))?;
    let Some((scheme, authority)) = endpoint.split_once("://") else {
        return Err(bad("Endpoint must start with http:// or https://"));
    };
    if !matches!(scheme, "http" | "https") || authority.is_empty() || authority.contains('/') {
        return Err(bad("Endpoint must be http(s)://host[:port]"));
    }
    if let Some(port) = port {
        let host = match authority.find(']') {
            Some(end) => &authority[..=end],
            None => authority.split(':').next().unwrap_or(authority),
        };
        endpoint = format!("{scheme}://{host}:{port}");
    }
    let access_key = key
        .filter(|k| !k.is_empty())
        .ok_or_else(|| bad("no AccessKey=..."))?;
    Ok(ConnectionString {
        endpoint,
        access_key,
    })
}

pub fn run(a: TokenArgs) -> Result<Exit, CliError> {
    let cs = parse_connection_string(&a.connection_string)?;
    let claims = ClientClaims {
        user_id: a.user.clone(),
        roles: a.roles.clone(),
        groups: a.groups.clone(),
    };
    let token = issue_client_token(&cs.access_key, &cs.endpoint, &a.hub, &claims, a.expires_in);
    let ws = match cs.endpoint.strip_prefix("https://") {
        Some(rest) => format!("wss://{rest}"),
        None => format!("ws://{}", cs.endpoint.trim_start_matches("http://")),
    };
    let url = format!(
        "{ws}/client/hubs/{}?access_token={token}",
        utf8_percent_encode(&a.hub, NON_ALPHANUMERIC)
    );
    let mut out = Out::new();
    if a.json {
        let mut o = Map::new();
        o.insert("url".into(), Value::from(url));
        o.insert("token".into(), Value::from(token));
        o.insert("expires_in".into(), Value::from(a.expires_in.as_secs()));
        out.json(o)?;
    } else {
        out.line(&url)?;
    }
    Ok(Exit::Success)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings() {
        assert_eq!(
            parse_connection_string("Endpoint=http://localhost:8080;AccessKey=k=ey==;Version=1.0;")
                .unwrap(),
            ConnectionString {
                endpoint: "http://localhost:8080".into(),
                access_key: "k=ey==".into()
            }
        );
        assert_eq!(
            parse_connection_string("endpoint=https://h.example/;accesskey=K;port=8443")
                .unwrap()
                .endpoint,
            "https://h.example:8443"
        );
        assert_eq!(
            parse_connection_string("Endpoint=http://h:1;AccessKey=K;Port=2")
                .unwrap()
                .endpoint,
            "http://h:2"
        );
        assert_eq!(
            parse_connection_string("Endpoint=http://[::1]:1;AccessKey=K;Port=2")
                .unwrap()
                .endpoint,
            "http://[::1]:2"
        );
        for bad in [
            "AccessKey=K",
            "Endpoint=ftp://h;AccessKey=K",
            "Endpoint=http://h/path;AccessKey=K",
            "Endpoint=http://h;AccessKey=",
            "Endpoint=http://h;AccessKey=K;Port=x",
            "Endpoint",
        ] {
            assert!(parse_connection_string(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
        for bad in ["", "0", "1w", "h", "-1"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
