//! Web PubSub clients of the chaos test: group members on tokio-tungstenite, and a REST
//! sender that sticks to one node until it dies, then moves to the next.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::StreamExt;
use statehub_webpubsub::{issue_token, ClientClaims};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;

use super::mqtt::Received;
use super::{Directory, Progress, PATIENCE};

pub const KEY: &str = "cluster-chaos-access-key";
pub const HUB: &str = "chaos";
pub const GROUP: &str = "g";

/// A member of [`GROUP`] (joined by its token) on `addr`, recording the data of every
/// message it gets; runs until its socket ends.
pub async fn member(addr: SocketAddr, user: &str) -> (Received, tokio::task::JoinHandle<()>) {
    let claims = ClientClaims {
        user_id: Some(user.to_owned()),
        roles: vec![],
        groups: vec![GROUP.to_owned()],
    };
    let mut ws = crate::common::wps::json_client(addr, KEY, HUB, &claims).await;
    match timeout(PATIENCE, ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => assert!(t.contains("\"connected\""), "{t}"),
        other => panic!("expected the connected message, got {other:?}"),
    }
    let received = Received::default();
    let record = received.clone();
    let task = tokio::spawn(async move {
        while let Some(frame) = ws.next().await {
            let Ok(Message::Text(text)) = frame else {
                continue;
            };
            let message: serde_json::Value = serde_json::from_str(&text).unwrap();
            if message["type"] == "message" {
                let data = message["data"].as_str().expect("text data").to_owned();
                record.lock().unwrap().push(data);
            }
        }
    });
    (received, task)
}

/// One REST send's outcome as the sender saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub data: String,
    /// 202: the node took it.
    pub accepted: bool,
    /// How many times the sender had moved to another node before it.
    pub stint: usize,
}

/// `POST /api/hubs/{HUB}/groups/{GROUP}/:send` with `data` as text; the status, or
/// `None` if the node did not answer (the send may or may not have happened).
async fn send(addr: SocketAddr, data: &str) -> Option<u16> {
    let path = format!("/api/hubs/{HUB}/groups/{GROUP}/:send?api-version=2024-12-01");
    let token = issue_token(
        KEY,
        &format!("http://{addr}{path}"),
        &ClientClaims {
            user_id: None,
            roles: vec![],
            groups: vec![],
        },
        Duration::from_secs(600),
    );
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{data}",
        data.len()
    );
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let text = String::from_utf8_lossy(&response);
        text.split_whitespace().nth(1)?.parse().ok()
    };
    timeout(PATIENCE, exchange).await.ok()?
}

/// Sends `s-0`, `s-1`, ... to the group until told to stop, one at a time, through one
/// node of `among` until it fails to answer, then through the next. A send without an
/// answer is not repeated (it may have happened: a repeat could deliver it twice).
pub async fn rest_sender(directory: Directory, among: Vec<usize>, progress: Progress) -> Vec<Sent> {
    let mut sent = Vec::new();
    let mut node = None;
    let mut stint = 0;
    for n in 0u32.. {
        if progress.stopping() {
            break;
        }
        let addr = match node {
            Some(addr) => addr,
            None => directory.pick(&among).await.1.http,
        };
        node = Some(addr);
        let data = format!("s-{n}");
        let status = send(addr, &data).await;
        assert!(
            status.is_none_or(|s| s == 202),
            "{data}: status {status:?} while Redis is up"
        );
        sent.push(Sent {
            data,
            accepted: status.is_some(),
            stint,
        });
        if status.is_some() {
            progress.ack();
        } else {
            node = None;
            stint += 1;
            progress.moved();
        }
    }
    sent
}

/// Checks a member's messages against the sends: each at most once and in the order
/// sent, and every accepted send arrived (a node answers 202 only once the send is in
/// Redis, so a SIGKILL right after loses nothing it accepted). A send without an
/// answer may or may not have arrived.
pub fn check(received: &[String], sent: &[Sent]) {
    let positions: std::collections::HashMap<&str, usize> = sent
        .iter()
        .enumerate()
        .map(|(i, s)| (s.data.as_str(), i))
        .collect();
    let position = |data: &str| positions.get(data).copied();
    let mut last = None;
    for (i, data) in received.iter().enumerate() {
        let at = position(data).unwrap_or_else(|| panic!("{data} was never sent"));
        assert!(
            last.is_none_or(|l| at > l),
            "{data} arrived twice or out of order: {:?}",
            &received[i.saturating_sub(5)..(i + 5).min(received.len())]
        );
        last = Some(at);
    }
    let arrived: std::collections::HashSet<&str> = received.iter().map(String::as_str).collect();
    let lost: Vec<&str> = sent
        .iter()
        .filter(|s| s.accepted && !arrived.contains(s.data.as_str()))
        .map(|s| s.data.as_str())
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} accepted sends never arrived, the first: {:?}",
        lost.len(),
        sent.iter().filter(|s| s.accepted).count(),
        &lost[..lost.len().min(20)]
    );
}
