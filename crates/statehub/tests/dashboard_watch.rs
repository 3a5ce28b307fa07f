//! The dashboard's live watch of a key, without the browser (the browser's view of it
//! is in dashboard.rs): its bounds. A viewer that stops reading is cut off with an
//! `overflow` event once `watch_buffer_events` behind; watches are capped by
//! `max_watches`; the KEYNOTIFY observation a watch holds ends with its stream.

mod common;
mod store_client;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use store_client::{StoreClient, PATIENCE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

const ADMIN_KEY: &str = "dashboard-admin-key-0123456789";

fn start(config: &str) -> common::Server {
    common::start_configured(config, &[])
}

/// Opens `GET path` with the admin key: the socket once the response head is in, with
/// the head.
async fn open_stream(addr: SocketAddr, path: &str) -> (tokio::net::TcpStream, String) {
    common::admin::open_stream(addr, path, ADMIN_KEY, PATIENCE).await
}

/// The `statehub_state_store_observations` gauge from `/metrics`.
async fn observations(addr: SocketAddr) -> u64 {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut body = String::new();
    timeout(PATIENCE, stream.read_to_string(&mut body))
        .await
        .unwrap()
        .unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix("statehub_state_store_observations "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no observations gauge in {body}"))
}

/// Waits until the gauge reads `want`.
async fn observations_become(addr: SocketAddr, want: u64) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = observations(addr).await;
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "observations stay {now}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_watch_viewer_is_cut_off_with_a_notice_and_watches_are_capped() {
    let server = start(&format!(
        "[admin]\nkey = \"{ADMIN_KEY}\"\nmax_watches = 1\nwatch_buffer_events = 4\n"
    ));
    let mut store = StoreClient::connect(server.mqtt, "watch-writer").await;
    let (mut slow, head) = open_stream(server.http, "/admin/api/store/watch?key=big").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    observations_become(server.http, 1).await;
    let (_, refused) = open_stream(server.http, "/admin/api/store/watch?key=other").await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");

    // 60 KiB values until the server cuts the viewer off: what its socket buffers
    // hold, plus 4 changes, at most.
    let value = vec![b'v'; 60 * 1024];
    let mut dropped = false;
    for _ in 0..2000 {
        let answer = store.call(&[b"SET", b"big", &value]).await;
        assert_eq!(answer.payload, b"+OK\r\n");
        while let Ok(line) = server.log.try_recv() {
            dropped |= line.contains("tap dropped: its reader fell behind");
        }
        if dropped {
            break;
        }
    }
    assert!(dropped, "the slow viewer was never cut off");

    // What was sent before the cut arrives, then the notice and the end of the stream.
    let mut seen = Vec::new();
    timeout(PATIENCE, slow.read_to_end(&mut seen))
        .await
        .expect("the stream ends")
        .unwrap();
    let text = String::from_utf8_lossy(&seen);
    assert!(
        text.contains("event: overflow"),
        "{}",
        &text[text.len().saturating_sub(300)..]
    );
    // The observation ended with the stream, and the place is free again.
    observations_become(server.http, 0).await;
    let (_, head) = open_stream(server.http, "/admin/api/store/watch?key=other").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}
