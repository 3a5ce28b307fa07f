//! The admin API's streams (the topic tail, the key watch) for the dashboard tests.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// Opens `GET path` with the admin key `key` and returns the socket once the response
/// head is in (each byte within `patience`), with the head.
pub async fn open_stream(
    addr: SocketAddr,
    path: &str,
    key: &str,
    patience: Duration,
) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let n = timeout(patience, stream.read(&mut byte))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            n,
            1,
            "closed before the head: {}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    (stream, String::from_utf8(head).unwrap())
}
