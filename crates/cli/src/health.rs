//! `statehub healthcheck`: GET a health URL and exit 0 on a 2xx answer, so a container
//! image needs no HTTP client of its own for its HEALTHCHECK.

use std::time::Duration;

use clap::Args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::error::{CliError, ClientError, Exit};

/// The most of the answer read: the status line is all that is looked at.
const HEAD_LIMIT: usize = 1024;

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The URL to GET (http only)
    #[arg(
        long,
        env = "STATEHUB_HEALTH_URL",
        default_value = "http://127.0.0.1:8080/healthz"
    )]
    url: String,
    /// Seconds to wait for the answer (exit code 5 past it)
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    timeout: u64,
}

pub async fn run(a: HealthArgs) -> Result<Exit, CliError> {
    let (authority, path) = split_url(&a.url)?;
    let wait = Duration::from_secs(a.timeout);
    match timeout(wait, get(authority, path)).await {
        Ok(Ok(status)) if (200..300).contains(&status) => {
            crate::output::note(&format!("{}: {status}", a.url));
            Ok(Exit::Success)
        }
        Ok(Ok(status)) => Err(CliError::Unhealthy { url: a.url, status }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ClientError::Timeout("waiting for the health answer").into()),
    }
}

/// `http://host:port/path` as (`host:port`, `/path`).
fn split_url(url: &str) -> Result<(&str, &str), CliError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| CliError::usage(format!("--url {url:?}: only http:// URLs")))?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority.is_empty() {
        return Err(CliError::usage(format!("--url {url:?} names no host")));
    }
    Ok((authority, if path.is_empty() { "/" } else { path }))
}

async fn get(authority: &str, path: &str) -> Result<u16, CliError> {
    let addr = if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let mut stream = TcpStream::connect(&addr)
        .await
        .map_err(|source| ClientError::Connect { addr, source })?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(ClientError::Io)?;
    let mut head = Vec::with_capacity(HEAD_LIMIT);
    let mut reader = stream.take(HEAD_LIMIT as u64);
    while !head.windows(2).any(|w| w == b"\r\n") {
        if reader.read_buf(&mut head).await.map_err(ClientError::Io)? == 0 {
            break;
        }
    }
    status_code(&head).ok_or_else(|| {
        CliError::BadResponse(format!(
            "not an HTTP status line: {:?}",
            String::from_utf8_lossy(&head[..head.len().min(80)])
        ))
    })
}

/// The code of an `HTTP/1.x NNN ...` status line.
fn status_code(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\r').next()?;
    let mut parts = line.split(|&b| b == b' ');
    if !parts.next()?.starts_with(b"HTTP/1.") {
        return None;
    }
    std::str::from_utf8(parts.next()?).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_status_lines() {
        assert_eq!(
            split_url("http://127.0.0.1:8080/healthz").unwrap(),
            ("127.0.0.1:8080", "/healthz")
        );
        assert_eq!(split_url("http://h").unwrap(), ("h", "/"));
        assert!(split_url("https://h/").is_err());
        assert!(split_url("http:///x").is_err());
        assert_eq!(status_code(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(
            status_code(b"HTTP/1.1 503 Service Unavailable\r\n"),
            Some(503)
        );
        assert_eq!(status_code(b"SSH-2.0\r\n"), None);
    }
}
