//! The dashboard's Web PubSub page pages its lists, in a real headless Chromium
//! (`tests/dashboard/wps_paging.mjs`): with `[admin] page_limit = 2`, three hubs, and
//! a hub with five connections in five groups, each list shows two at a time and
//! Next and Previous walk it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures_util::StreamExt;
use statehub_webpubsub::ClientClaims;
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const ADMIN_KEY: &str = "dashboard-admin-key-0123456789";
const WPS_KEY: &str = "dashboard-access-key-0123456789";
const PATIENCE: Duration = Duration::from_secs(30);

fn script_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/dashboard")
}

/// A Web PubSub client of `hub` in `groups`, connected.
async fn wps_client(
    addr: std::net::SocketAddr,
    hub: &str,
    user: &str,
    groups: &[&str],
) -> WebSocketStream<MaybeTlsStream<TcpStream>> {
    let claims = ClientClaims {
        user_id: Some(user.into()),
        roles: vec![],
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
    };
    let mut ws = common::wps::json_client(addr, WPS_KEY, hub, &claims).await;
    let first = timeout(PATIENCE, ws.next())
        .await
        .expect("connected message");
    assert!(
        matches!(&first, Some(Ok(Message::Text(t))) if t.contains("\"connected\"")),
        "{first:?}"
    );
    ws
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_pubsub_lists_page_in_headless_chromium() {
    let chromium =
        std::env::var_os("CHROMIUM").map_or_else(|| "/usr/bin/chromium".into(), PathBuf::from);
    assert!(
        chromium.exists() && script_dir().join("node_modules/playwright-core").is_dir(),
        "run `bash scripts/install-test-deps.sh` (chromium and playwright-core)"
    );
    let server = common::start_configured(
        &format!("[admin]\nkey = \"{ADMIN_KEY}\"\npage_limit = 2\n"),
        &["--access-key", WPS_KEY],
    );
    let mut clients = Vec::new();
    for i in 1..=5 {
        let (user, group) = (format!("user-{i}"), format!("g{i}"));
        clients.push(wps_client(server.http, "pa", &user, &[&group]).await);
    }
    clients.push(wps_client(server.http, "pb", "user-b", &[]).await);
    clients.push(wps_client(server.http, "pc", "user-c", &[]).await);

    let run = tokio::process::Command::new("node")
        .arg("wps_paging.mjs")
        .current_dir(script_dir())
        .env("STATEHUB_URL", format!("http://{}", server.http))
        .env("STATEHUB_ADMIN_KEY", ADMIN_KEY)
        .env("CHROMIUM", &chromium)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = timeout(Duration::from_secs(240), run)
        .await
        .expect("the browser run took over 240 s")
        .expect("node (scripts/install-test-deps.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = format!(
        "{stdout}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT line\n{report}"));
    let result: serde_json::Value = serde_json::from_str(result).unwrap();
    assert_eq!(result["failed"], serde_json::json!([]), "{report}");
    assert!(out.status.success(), "{report}");
    assert_eq!(result["passed"], 3, "{report}");
    drop(clients);
}
