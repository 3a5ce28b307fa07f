//! The HTTP listener's security: Web PubSub over wss://, the REST API never open
//! without a key. (MQTT over wss:// is tested in mqtt_wss.rs and mqtt_ws_clients.rs.)

use super::*;

#[test]
fn web_pubsub_js_sdk_over_wss() {
    let pki = Pki::new();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/webpubsub-sdk/js");
    assert!(
        dir.join("node_modules/@azure/web-pubsub-client").is_dir(),
        "run scripts/install-test-deps.sh (the JS SDKs)"
    );
    let out = Command::new("node")
        .arg("tls.mjs")
        .current_dir(&dir)
        .env("STATEHUB_BIN", BIN)
        .env("STATEHUB_HTTP_TLS", "true")
        .env("STATEHUB_TLS_CERT", pki.path("server.crt"))
        .env("STATEHUB_TLS_KEY", pki.path("server.key"))
        .env("NODE_EXTRA_CA_CERTS", pki.path("ca.pem"))
        .env_remove("STATEHUB_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let report = format!(
        "{text}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
    let result = text
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT line: {report}"));
    let result: serde_json::Value = serde_json::from_str(result).unwrap();
    assert_eq!(result["failed"], serde_json::json!([]), "{report}");
    assert!(result["passed"].as_u64().unwrap_or(0) >= 4, "{report}");
}

/// Sends one HTTP request and returns the status line.
fn http_status(addr: SocketAddr, request: &str) -> String {
    use std::io::Read as _;
    let mut s = common::connect_tcp(addr);
    s.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    let _ = s.read_to_string(&mut response);
    response.lines().next().unwrap_or("").to_owned()
}

#[test]
fn the_rest_api_is_never_open_without_a_key() {
    let send = "POST /api/hubs/h/:send?api-version=2024-12-01 HTTP/1.1\r\nHost: x\r\n\
                Content-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi";
    let keyless = common::start(
        &[
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert!(
        http_status(keyless.http, send).contains(" 404"),
        "not mounted without keys"
    );
    let keyed = common::start(
        &[
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ],
        &[("STATEHUB_ACCESS_KEYS", "0123456789abcdef-key")],
    );
    assert!(
        http_status(keyed.http, send).contains(" 401"),
        "a token is required"
    );
}
