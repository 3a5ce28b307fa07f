//! Where and how to connect: the mosquitto clients' flags (`-h`, `-p`, `-u`, `-P`, `-i`,
//! `-k`), or a URL (`-L` / `STATEHUB_URL`), flags winning over the URL.

use std::time::Duration;

use clap::{ArgAction, Args};
use percent_encoding::percent_decode_str;

use crate::error::CliError;

pub const DEFAULT_PORT: u16 = 1883;

/// The connection options every MQTT subcommand takes. `-h` is the host, as in the
/// mosquitto clients, so help is `--help` only.
#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    /// Server host name or address [default: localhost]
    #[arg(short = 'h', long, value_name = "HOST")]
    pub host: Option<String>,
    /// Server MQTT port [default: 1883]
    #[arg(short = 'p', long, value_name = "PORT")]
    pub port: Option<u16>,
    /// User name
    #[arg(short = 'u', long, value_name = "USER")]
    pub username: Option<String>,
    /// Password
    #[arg(
        short = 'P',
        long = "pw",
        visible_alias = "password",
        value_name = "PASSWORD"
    )]
    pub password: Option<String>,
    /// Client identifier [default: statehub-<command>-<pid>-<random>]
    #[arg(short = 'i', long = "id", value_name = "ID")]
    pub client_id: Option<String>,
    /// Keep alive in seconds (0: none)
    #[arg(short = 'k', long, value_name = "SECS", default_value_t = 60)]
    pub keepalive: u16,
    /// The server as mqtt://[user[:password]@]host[:port]; -h, -p, -u and -P win over it
    #[arg(
        short = 'L',
        long,
        env = "STATEHUB_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub url: Option<String>,
    /// Seconds to wait for the connection and for each answer (exit code 5 past it)
    #[arg(long, value_name = "SECS", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub timeout: u32,
    /// Print connection and subscription events on stderr
    #[arg(short = 'd', long)]
    pub debug: bool,
    /// Print help (`-h` is the host)
    #[arg(long, action = ArgAction::Help)]
    help: Option<bool>,
}

/// Resolved connection settings.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub username: Option<String>,
    pub password: Option<Vec<u8>>,
    pub client_id: String,
    pub keep_alive: u16,
    pub timeout: Duration,
    pub debug: bool,
}

impl Endpoint {
    /// `host:port` as given (brackets kept around an IPv6 address).
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl ConnectArgs {
    /// The settings for a command named `command` (it names the default client id).
    pub fn resolve(&self, command: &str) -> Result<Endpoint, CliError> {
        let url = match &self.url {
            Some(url) => parse_url(url)?,
            None => UrlParts::default(),
        };
        let client_id = self
            .client_id
            .clone()
            .unwrap_or_else(|| default_id(command));
        Ok(Endpoint {
            host: self
                .host
                .clone()
                .or(url.host)
                .unwrap_or_else(|| "localhost".to_owned()),
            port: self.port.or(url.port).unwrap_or(DEFAULT_PORT),
            username: self.username.clone().or(url.username),
            password: self
                .password
                .as_ref()
                .map(|p| p.as_bytes().to_vec())
                .or(url.password),
            client_id,
            keep_alive: self.keepalive,
            timeout: Duration::from_secs(u64::from(self.timeout)),
            debug: self.debug,
        })
    }
}

/// A client id unique enough for a command-line run: the process id and the clock's
/// nanoseconds.
fn default_id(command: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("statehub-{command}-{}-{nanos:08x}", std::process::id())
}

#[derive(Debug, Default, PartialEq, Eq)]
struct UrlParts {
    host: Option<String>,
    port: Option<u16>,
    username: Option<String>,
    password: Option<Vec<u8>>,
}

/// `mqtt://[user[:password]@]host[:port][/]`, user and password percent-decoded.
fn parse_url(url: &str) -> Result<UrlParts, CliError> {
    let bad = |why: &str| CliError::usage(format!("STATEHUB_URL / --url {url:?}: {why}"));
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("expected mqtt://[user[:password]@]host[:port]"))?;
    match scheme.to_ascii_lowercase().as_str() {
        "mqtt" | "tcp" => {}
        "mqtts" | "ssl" => return Err(bad("TLS connections are not supported yet")),
        other => return Err(bad(&format!("unknown scheme {other:?}, expected mqtt"))),
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains('/') || authority.contains('?') {
        return Err(bad("a path or query is not allowed"));
    }
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let decode = |s: &str| percent_decode_str(s).collect::<Vec<u8>>();
    let (username, password) = match userinfo {
        None => (None, None),
        Some(info) => {
            let (user, pass) = match info.split_once(':') {
                Some((u, p)) => (u, Some(decode(p))),
                None => (info, None),
            };
            let user =
                String::from_utf8(decode(user)).map_err(|_| bad("the user name is not UTF-8"))?;
            (Some(user), pass)
        }
    };
    let (host, port) = split_host_port(hostport).ok_or_else(|| bad("bad host or port"))?;
    Ok(UrlParts {
        host: (!host.is_empty()).then(|| host.to_owned()),
        port,
        username,
        password,
    })
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn split_host_port(s: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after {
            "" => Some((host, None)),
            _ => Some((host, Some(after.strip_prefix(':')?.parse().ok()?))),
        };
    }
    match s.split_once(':') {
        None => Some((s, None)),
        Some((host, port)) => Some((host, Some(port.parse().ok()?))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("mqtt://alice:p%40ss:w@broker.local:1884").unwrap(),
            UrlParts {
                host: Some("broker.local".into()),
                port: Some(1884),
                username: Some("alice".into()),
                password: Some(b"p@ss:w".to_vec()),
            }
        );
        assert_eq!(
            parse_url("mqtt://[::1]:1999/").unwrap(),
            UrlParts {
                host: Some("::1".into()),
                port: Some(1999),
                ..UrlParts::default()
            }
        );
        assert_eq!(
            parse_url("tcp://bob@h").unwrap(),
            UrlParts {
                host: Some("h".into()),
                username: Some("bob".into()),
                ..UrlParts::default()
            }
        );
        for bad in [
            "broker:1883",
            "http://h",
            "mqtts://h",
            "mqtt://h:port",
            "mqtt://h/topic",
            "mqtt://[::1",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags_win_over_the_url() {
        let args = ConnectArgs {
            host: Some("flag-host".into()),
            port: None,
            username: None,
            password: Some("flag-pw".into()),
            client_id: Some("me".into()),
            keepalive: 5,
            url: Some("mqtt://u:p@url-host:2000".into()),
            timeout: 3,
            debug: false,
            help: None,
        };
        let e = args.resolve("kv").unwrap();
        assert_eq!(e.address(), "flag-host:2000");
        assert_eq!(e.username.as_deref(), Some("u"));
        assert_eq!(e.password.as_deref(), Some(&b"flag-pw"[..]));
        assert_eq!(e.client_id, "me");
        assert_eq!(e.timeout, Duration::from_secs(3));
    }
}
