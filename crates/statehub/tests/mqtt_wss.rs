//! MQTT over WebSocket over TLS (`wss://…/mqtt`) on the binary's HTTPS listener, byte
//! for byte (tokio-tungstenite over tokio-rustls): the same broker and bounds as
//! `ws://` (split and packed packets, 1003 and 1009 closes, the CONNECT timeout), a
//! client that does not trust the server's CA refused while others are served, and
//! client certificates authenticating when the listener asks for them. Every
//! certificate is made by the test (rcgen).

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::mqtt_ws::*;
use common::Server;
use futures_util::SinkExt;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use statehub_auth::testing::{Pem, TestCa};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

type Wss = WebSocketStream<TlsStream<TcpStream>>;

/// The server's certificates, and a client certificate from the same CA.
struct Pki {
    dir: tempfile::TempDir,
    ca: String,
    device: Pem,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("statehub test CA");
        let server = ca.server();
        std::fs::write(dir.path().join("ca.pem"), &ca.cert).unwrap();
        std::fs::write(dir.path().join("server.crt"), &server.cert).unwrap();
        std::fs::write(dir.path().join("server.key"), &server.key).unwrap();
        let device = ca.client("device-7", &[]);
        Pki {
            dir,
            ca: ca.cert.clone(),
            device,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The binary with an HTTPS listener, `args` and `config` (TOML) besides.
    fn start(&self, config: &str, args: &[&str]) -> Server {
        let file = self.path("statehub.toml");
        std::fs::write(&file, config).unwrap();
        let (cert, key) = (self.path("server.crt"), self.path("server.key"));
        let tls = [
            "--http-tls",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--config",
            file.to_str().unwrap(),
        ];
        common::start_local(&[&tls[..], args].concat())
    }
}

/// A TLS client trusting `ca` (PEM), presenting `cert` if any.
fn tls_client(ca: &str, cert: Option<&Pem>) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match cert {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let chain = CertificateDer::pem_slice_iter(pem.cert.as_bytes())
                .map(Result::unwrap)
                .collect();
            let key = PrivateKeyDer::from_pem_slice(pem.key.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Opens `wss://localhost:port/mqtt` (subprotocol mqtt) through `tls`.
async fn open(
    addr: SocketAddr,
    tls: &tokio_rustls::TlsConnector,
) -> Result<Wss, Box<dyn std::error::Error>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost")?;
    let stream = tls.connect(name, tcp).await?;
    let url = format!("wss://localhost:{}/mqtt", addr.port());
    let mut req = url.into_client_request()?;
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", HeaderValue::from_static("mqtt"));
    let (ws, _) = tokio_tungstenite::client_async(req, stream).await?;
    Ok(ws)
}

async fn connected(addr: SocketAddr, tls: &tokio_rustls::TlsConnector) -> Wss {
    let mut ws = open(addr, tls).await.unwrap();
    mqtt_connect(&mut ws).await;
    ws
}

#[tokio::test]
async fn packets_split_over_frames_and_packed_in_one_over_wss() {
    let pki = Pki::new();
    let server = pki.start("", &[]);
    let tls = tls_client(&pki.ca, None);
    let mut ws = open(server.http, &tls).await.unwrap();
    split_and_packed(&mut ws).await;
    // More than one TLS record each way (16 KiB each): 100 KiB to itself.
    // Remaining length 100 003 (topic "t" and 100 000 bytes), as a variable integer.
    let mut big = vec![0x30, 0xA3, 0x8D, 0x06, 0, 1, b't'];
    big.resize(4 + 100_003, b'z');
    ws.send(Message::binary(big.clone())).await.unwrap();
    expect_bytes(&mut ws, &big).await;
}

#[tokio::test]
async fn text_and_oversize_frames_are_refused_over_wss() {
    let pki = Pki::new();
    let server = pki.start("[mqtt]\nmax_packet_size = 1024\n", &[]);
    let tls = tls_client(&pki.ca, None);
    let mut ws = connected(server.http, &tls).await;
    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(close_code(&mut ws).await, Some(1003));
    let mut ws = connected(server.http, &tls).await;
    ws.send(Message::binary(vec![0u8; 1 << 20])).await.unwrap();
    assert_eq!(close_code(&mut ws).await, Some(1009));
    let mut ws = connected(server.http, &tls).await;
    ws.send(Message::binary(PINGREQ.to_vec())).await.unwrap();
    expect_bytes(&mut ws, &PINGRESP).await;
}

#[tokio::test]
async fn a_wss_client_without_connect_is_closed_after_the_connect_timeout() {
    let pki = Pki::new();
    let server = pki.start("[mqtt]\nconnect_timeout_secs = 1\n", &[]);
    let tls = tls_client(&pki.ca, None);
    let opened = Instant::now();
    let mut silent = open(server.http, &tls).await.unwrap();
    let mut other = connected(server.http, &tls).await;
    other.send(Message::binary(PINGREQ.to_vec())).await.unwrap();
    expect_bytes(&mut other, &PINGRESP).await;
    assert_eq!(close_code(&mut silent).await, Some(1000));
    assert!(opened.elapsed() >= Duration::from_secs(1));
}

/// A client that does not trust the server's certificate never gets a WebSocket;
/// the listener serves the next client.
#[tokio::test]
async fn a_client_trusting_another_ca_is_refused() {
    let pki = Pki::new();
    let server = pki.start("", &[]);
    let stranger = TestCa::new("unknown CA");
    let Err(error) = open(server.http, &tls_client(&stranger.cert, None)).await else {
        panic!("the handshake must fail");
    };
    assert!(
        error.to_string().contains("certificate"),
        "expected a certificate error: {error}"
    );
    let mut ws = connected(server.http, &tls_client(&pki.ca, None)).await;
    ws.send(Message::binary(PINGREQ.to_vec())).await.unwrap();
    expect_bytes(&mut ws, &PINGRESP).await;
}

/// When the HTTPS listener asks for client certificates (`--tls-client-ca`), a
/// certificate from that CA authenticates a wss client as on an MQTT listener with
/// X.509; without one, a listener that takes only passwords refuses it (return
/// code 5).
#[tokio::test]
async fn a_client_certificate_authenticates_a_wss_client() {
    let pki = Pki::new();
    let passwd = pki.path("passwd");
    std::fs::write(&passwd, "").unwrap();
    let ca = pki.path("ca.pem");
    let server = pki.start(
        "",
        &[
            "--password-file",
            passwd.to_str().unwrap(),
            "--tls-client-ca",
            ca.to_str().unwrap(),
        ],
    );
    let mut anonymous = open(server.http, &tls_client(&pki.ca, None)).await.unwrap();
    anonymous
        .send(Message::binary(CONNECT.to_vec()))
        .await
        .unwrap();
    expect_bytes(&mut anonymous, &[0x20, 2, 0, 5]).await;
    let device = tls_client(&pki.ca, Some(&pki.device));
    let mut ws = connected(server.http, &device).await;
    ws.send(Message::binary(PINGREQ.to_vec())).await.unwrap();
    expect_bytes(&mut ws, &PINGRESP).await;
}
