//! TLS versions on the MQTT TLS listener and the HTTPS listener: a client offering
//! only TLS 1.0 or 1.1 fails the handshake with a fatal alert and never sees a
//! ServerHello; a default client negotiates TLS 1.3, and one limited to TLS 1.2 still
//! gets in.
//!
//! The old clients are ClientHellos written here byte by byte (legacy version
//! 0x0301/0x0302, no supported_versions extension), as a TLS 1.0/1.1 client sends
//! them: the installed OpenSSL may refuse to offer those versions at all, and a
//! refusal of the client's own would prove nothing about the server. (`openssl
//! s_client -tls1_1 -cipher 'DEFAULT@SECLEVEL=0'`, where allowed, gets the same alert
//! 40 as the first hello here.)

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::version::{TLS12, TLS13};
use rustls::{ProtocolVersion, SupportedProtocolVersion};

use super::*;

/// A ClientHello of a client that speaks only `version` (0x0301: TLS 1.0, 0x0302:
/// TLS 1.1), with cipher suites of that era and the extensions OpenSSL's `s_client
/// -tls1_1` sends (SNI, groups, point formats; no supported_versions). With
/// `sig_algs`, also signature_algorithms, which only TLS 1.2 defines: a client that
/// knows TLS 1.2's extensions but still offers 1.1 at most.
fn old_client_hello(version: u16, sig_algs: bool) -> Vec<u8> {
    let mut body = version.to_be_bytes().to_vec();
    body.extend((0..32u8).map(|i| i.wrapping_mul(37)));
    body.push(0); // no session id
                  // ECDHE-ECDSA/RSA with AES-128/256-CBC-SHA, RSA AES-128/256-CBC-SHA.
    let suites: [u16; 6] = [0xc009, 0xc013, 0xc00a, 0xc014, 0x002f, 0x0035];
    body.extend(u16s_with_len(&suites));
    body.extend([1, 0]); // compression: null
    let host = b"localhost";
    let mut server_name = ((host.len() + 3) as u16).to_be_bytes().to_vec();
    server_name.push(0); // host_name
    server_name.extend((host.len() as u16).to_be_bytes());
    server_name.extend(host);
    let mut extensions = extension(0x0000, &server_name);
    extensions.extend(extension(0x000a, &u16s_with_len(&[0x001d, 0x0017])));
    extensions.extend(extension(0x000b, &[1, 0]));
    if sig_algs {
        extensions.extend(extension(0x000d, &u16s_with_len(&[0x0403, 0x0804, 0x0401])));
    }
    body.extend((extensions.len() as u16).to_be_bytes());
    body.extend(extensions);
    let mut handshake = vec![1]; // client_hello
    handshake.extend(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend(body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend((handshake.len() as u16).to_be_bytes());
    record.extend(handshake);
    record
}

fn u16s_with_len(values: &[u16]) -> Vec<u8> {
    let mut out = ((values.len() * 2) as u16).to_be_bytes().to_vec();
    out.extend(values.iter().flat_map(|v| v.to_be_bytes()));
    out
}

fn extension(kind: u16, data: &[u8]) -> Vec<u8> {
    let mut out = kind.to_be_bytes().to_vec();
    out.extend((data.len() as u16).to_be_bytes());
    out.extend(data);
    out
}

/// What the server answers an old ClientHello with, until it closes.
fn answer_to_old_client(addr: SocketAddr, version: u16, sig_algs: bool) -> Vec<u8> {
    let mut s = common::connect_tcp(addr);
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(&old_client_hello(version, sig_algs)).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    answer
}

/// Asserts one fatal alert with this description and nothing else (no ServerHello).
fn assert_fatal_alert(answer: &[u8], description: u8, what: &str) {
    assert!(
        answer.len() == 7 && answer[0] == 0x15 && answer[5] == 2 && answer[6] == description,
        "{what}: expected fatal alert {description}, got {answer:02x?}"
    );
}

/// A rustls client trusting `ca` and offering `versions`, connected to `addr`.
fn tls_client(
    addr: SocketAddr,
    ca: &str,
    versions: &[&'static SupportedProtocolVersion],
) -> (rustls::ClientConnection, TcpStream) {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = common::connect_tcp(addr);
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    (tls, tcp)
}

/// Handshakes offering `versions`, sends `request` and returns the negotiated
/// version and the first bytes of the answer.
fn handshake(
    addr: SocketAddr,
    ca: &str,
    versions: &[&'static SupportedProtocolVersion],
    request: &[u8],
) -> (ProtocolVersion, Vec<u8>) {
    let (mut tls, mut tcp) = tls_client(addr, ca, versions);
    while tls.is_handshaking() {
        tls.complete_io(&mut tcp).expect("handshake");
    }
    let version = tls.protocol_version().unwrap();
    let mut stream = rustls::Stream::new(&mut tls, &mut tcp);
    stream.write_all(request).unwrap();
    let mut answer = vec![0; 16];
    let n = stream.read(&mut answer).expect("an answer over TLS");
    answer.truncate(n);
    (version, answer)
}

/// An MQTT 3.1.1 CONNECT of client "v", clean session, keep alive 60, no credentials.
const MQTT_CONNECT: &[u8] = &[
    0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60, 0, 1, b'v',
];
const HTTP_HEALTH: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

#[test]
fn tls_older_than_1_2_is_refused_and_1_3_is_preferred() {
    let pki = Pki::new();
    let https = format!(
        "\n[http.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        pki.p("server.crt"),
        pki.p("server.key")
    );
    let (server, _plain, mqtts) = start(&pki.config(&https));
    let listeners = [
        ("MQTT", mqtts, MQTT_CONNECT),
        ("HTTPS", server.http, HTTP_HEALTH),
    ];
    for (what, addr, request) in listeners {
        // A TLS 1.0/1.1 client gets handshake_failure (40): rustls refuses a hello
        // without signature_algorithms before it looks at the version. One that sends
        // it gets protocol_version (70).
        for (name, version) in [("TLS 1.0", 0x0301), ("TLS 1.1", 0x0302)] {
            let answer = answer_to_old_client(addr, version, false);
            assert_fatal_alert(&answer, 40, &format!("{what} {name}"));
            let answer = answer_to_old_client(addr, version, true);
            assert_fatal_alert(
                &answer,
                70,
                &format!("{what} {name} with signature_algorithms"),
            );
        }
        // The default client (1.3 and 1.2 offered) gets 1.3; one limited to 1.2 gets
        // in too. The answer shows the protocol works over it: a CONNACK (refusing
        // the anonymous client, return code 5) or an HTTP status line.
        let expect: &[u8] = if what == "MQTT" {
            &[0x20, 2, 0, 5]
        } else {
            b"HTTP/1.1 200"
        };
        let both: &[&SupportedProtocolVersion] = &[&TLS13, &TLS12];
        for (versions, negotiated) in [
            (both, ProtocolVersion::TLSv1_3),
            (&[&TLS12][..], ProtocolVersion::TLSv1_2),
        ] {
            let (version, answer) = handshake(addr, &pki.ca.cert, versions, request);
            assert_eq!(version, negotiated, "{what}");
            assert!(
                answer.starts_with(expect),
                "{what} over {version:?}: {answer:02x?}"
            );
        }
    }
    let failures = metric_value(
        server.http,
        &pki.ca.cert,
        "statehub_mqtt_tls_handshake_failures_total",
    );
    assert!(
        failures >= 2.0,
        "the refused MQTT handshakes are counted: {failures}"
    );
}

/// A metric's value, scraped over HTTPS.
fn metric_value(addr: SocketAddr, ca: &str, name: &str) -> f64 {
    let (mut tls, mut tcp) = tls_client(addr, ca, &[&TLS13]);
    let mut stream = rustls::Stream::new(&mut tls, &mut tcp);
    let request = HTTP_HEALTH.to_vec();
    let request = String::from_utf8(request)
        .unwrap()
        .replace("/healthz", "/metrics");
    stream.write_all(request.as_bytes()).unwrap();
    let mut text = Vec::new();
    let _ = stream.read_to_end(&mut text);
    let text = String::from_utf8_lossy(&text);
    let line = text.lines().find(|l| l.starts_with(&format!("{name} ")));
    let value = line.and_then(|l| l.split_whitespace().nth(1));
    value
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics: {text}"))
}
