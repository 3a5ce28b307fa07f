//! Errors a new user meets first, made to say what to do: a listen address that is a
//! host name, a port already taken, a data directory that is a file, a bad environment
//! variable, and Web PubSub routes asked for while Web PubSub is off.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::any;
use axum::Router;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::Parser;
use serde::Deserialize;

/// A listen address: `IP:PORT`, or `HOST:PORT` with HOST resolved now (an IPv4 address
/// first, as `localhost:1883` users expect 127.0.0.1).
pub fn listen_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!(
            "{text:?} is not HOST:PORT (such as 0.0.0.0:1883, localhost:1883 or [::]:1883)"
        ));
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{port:?} in {text:?} is not a port number (0 to 65535)"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host:?}: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{host:?} resolves to no address"))
}

/// [`listen_addr`] for the TOML file's `mqtt_listen` and `http_listen`.
pub fn de_listen_addr<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<SocketAddr>, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(text) => listen_addr(&text)
            .map(Some)
            .map_err(serde::de::Error::custom),
        None => Ok(None),
    }
}

/// A listener that cannot bind: which one, on which address, and where it was set.
pub fn bind_error(listener: &str, addr: SocketAddr, e: std::io::Error) -> std::io::Error {
    let hint = match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            " (another process listens there: stop it or pick another port)"
        }
        std::io::ErrorKind::PermissionDenied => " (ports below 1024 need privileges)",
        _ => "",
    };
    let flag = listener.to_ascii_lowercase();
    std::io::Error::new(
        e.kind(),
        format!(
            "cannot listen for {listener} on {addr} (--{flag}-listen, STATEHUB_{}_LISTEN or {flag}_listen): {e}{hint}",
            listener.to_ascii_uppercase()
        ),
    )
}

/// A data directory path that exists but is not a directory is refused up front, with
/// one clear line, before the storage layer tries to create it.
pub fn check_data_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => Err(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            format!("data directory {} is not a directory", dir.display()),
        )),
        _ => Ok(()),
    }
}

/// Parses the command line; an invalid value that came from an environment variable
/// (the flag itself not given) is reported under the variable's name.
pub fn parse<P: Parser>() -> P {
    P::try_parse().unwrap_or_else(|e| name_env_var(e, &P::command()).exit())
}

fn name_env_var(e: clap::Error, command: &clap::Command) -> clap::Error {
    if !matches!(
        e.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return e;
    }
    let Some(ContextValue::String(shown)) = e.get(ContextKind::InvalidArg) else {
        return e;
    };
    let Some(long) = shown.split(' ').next().and_then(|f| f.strip_prefix("--")) else {
        return e;
    };
    let given =
        std::env::args().any(|a| a == format!("--{long}") || a.starts_with(&format!("--{long}=")));
    let Some(var) = env_of(command, long).filter(|v| !given && std::env::var_os(v).is_some())
    else {
        return e;
    };
    let text = e.to_string().replacen(
        &format!("'{shown}'"),
        &format!("{var} (the environment variable of --{long})"),
        1,
    );
    clap::Error::raw(e.kind(), text.trim_start_matches("error: ")).with_cmd(command)
}

/// The environment variable of the flag `--long`, in `command` or a subcommand.
fn env_of(command: &clap::Command, long: &str) -> Option<String> {
    let here = command
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned());
    here.or_else(|| command.get_subcommands().find_map(|c| env_of(c, long)))
}

/// What the Web PubSub routes answer while Web PubSub is off (no access key).
const WPS_OFF: &str = r#"{"code":"WebPubSubOff","message":"Web PubSub is off because no access key is configured: start statehub with --access-key KEY (16 characters or more), STATEHUB_ACCESS_KEYS=KEY or access_keys in the [webpubsub] table of the --config file"}"#;

/// The Web PubSub routes when it is off: a JSON 404 that says how to turn it on.
pub fn webpubsub_off() -> Router {
    let off = || async {
        (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "application/json")],
            WPS_OFF,
        )
            .into_response()
    };
    Router::new()
        .route("/client", any(off))
        .route("/client/{*rest}", any(off))
        .route("/api/{*rest}", any(off))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(listen_addr("0.0.0.0:1883").unwrap().port(), 1883);
        assert_eq!(
            listen_addr("[::1]:80").unwrap(),
            "[::1]:80".parse().unwrap()
        );
        let local = listen_addr("localhost:1883").unwrap();
        assert!(local.ip().is_loopback() && local.port() == 1883, "{local}");
        assert!(listen_addr("1883").unwrap_err().contains("HOST:PORT"));
        assert!(listen_addr("localhost:http")
            .unwrap_err()
            .contains("port number"));
    }

    #[test]
    fn wps_off_body_is_json() {
        let v: serde_json::Value = serde_json::from_str(WPS_OFF).unwrap();
        assert!(v["message"].as_str().unwrap().contains("--access-key"));
    }
}
