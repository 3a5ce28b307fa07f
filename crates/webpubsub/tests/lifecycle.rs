//! Server-side ends of a connection on a real socket: shutdown closes every client with
//! `disconnected` and a close frame (not a cut) and tells the upstream; a socket that
//! stops answering pings is closed as dead; new clients are refused once shutdown began.

mod common;

use std::time::Duration;

use common::upstream::*;
use common::*;
use statehub_webpubsub::{router, Config, Limits, WebPubSub};
use statehub_webpubsub::{HubSettings, SystemEvent};
use tokio_tungstenite::tungstenite::Error as WsError;

#[tokio::test]
async fn shutdown_closes_every_client_and_posts_disconnected() {
    let mut up = fake_upstream(posts(|_| empty())).await;
    let (addr, wps) = start_hub(HubSettings {
        event_handlers: vec![handler(up.url(), "", &[SystemEvent::Disconnected])],
        allow_anonymous: false,
    })
    .await;
    let t = token(addr, "chat", Some("u"), &[], &[]);
    let (mut plain, _) = connect(addr, "chat", &t, Some(JSON)).await;
    let (mut reliable, _) = connect(addr, "chat", &t, Some(RELIABLE)).await;
    let (mut raw, _) = connect(addr, "chat", &t, None).await;

    let done = tokio::spawn({
        let wps = wps.clone();
        async move { wps.shutdown(Duration::from_secs(5)).await }
    });
    let d = recv(&mut plain).await;
    assert_eq!(d["event"], "disconnected");
    assert_eq!(d["message"], "The server is shutting down");
    assert_eq!(close_code(&mut plain).await, Some(1001));
    assert_eq!(recv(&mut reliable).await["event"], "disconnected");
    assert_eq!(
        close_code(&mut reliable).await,
        Some(1008),
        "the session dies with the process"
    );
    assert_eq!(close_code(&mut raw).await, Some(1001));
    tokio::time::timeout(Duration::from_secs(5), done)
        .await
        .expect("shutdown waits for the sockets, not for the grace")
        .unwrap();
    for _ in 0..3 {
        let post = up.next_post().await;
        assert_eq!(post.json()["reason"], "The server is shutting down");
    }
    match try_connect(
        &format!("ws://{addr}/client/hubs/chat?access_token={t}"),
        Some(JSON),
    )
    .await
    {
        Err(WsError::Http(resp)) => assert_eq!(resp.status(), 503),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_silent_socket_is_closed_as_dead() {
    let mut config = Config::new([KEY]);
    config.limits = Limits {
        ping_interval: Duration::from_millis(200),
        idle_timeout: Duration::from_millis(400),
        ..Limits::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(WebPubSub::new(config))).await });
    let t = token(addr, "chat", None, &[], &[]);
    let (mut silent, _) = connect(addr, "chat", &t, Some(RELIABLE)).await;
    let (mut live, _) = connect(addr, "chat", &t, Some(JSON)).await;
    // `live` reads (and so answers pings) all along; `silent` reads nothing for a while.
    let keep_alive = tokio::spawn(async move {
        let until = tokio::time::Instant::now() + Duration::from_millis(1200);
        while tokio::time::Instant::now() < until {
            let _ = tokio::time::timeout(Duration::from_millis(50), next_frame(&mut live)).await;
        }
        live
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let d = recv(&mut silent).await;
    assert_eq!(d["event"], "disconnected");
    assert!(d["message"]
        .as_str()
        .unwrap()
        .starts_with("No frame from the client"));
    assert_eq!(close_code(&mut silent).await, Some(1001));
    let mut live = keep_alive.await.unwrap();
    assert!(
        sync(&mut live).await.is_empty(),
        "a client answering pings stays"
    );
}
