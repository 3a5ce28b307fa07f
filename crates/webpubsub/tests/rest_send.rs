//! The REST API on a real socket, part 1: authentication, health, the four sends with
//! their content types, `excluded` and `filter`, and bad input.

mod common;

use common::api::{client, rest_token, Api, V};
use common::*;
use serde_json::json;
use statehub_webpubsub::Limits;
use tokio_tungstenite::tungstenite::Message;

const INVALID_FILTER: &str = "Invalid syntax for 'invalid filter': Syntax error at position 14 in 'invalid filter'. (Parameter 'filter')";

#[tokio::test]
async fn health_needs_no_token() {
    let addr = start(Limits::default()).await;
    let api = Api::new(addr);
    let url = format!("http://{addr}/api/health?{V}");
    assert_eq!(api.raw("HEAD", &url, None, None, vec![]).await.status, 200);
    assert_eq!(api.raw("GET", &url, None, None, vec![]).await.status, 200);
}

#[tokio::test]
async fn tokens_must_name_this_url() {
    let addr = start(Limits::default()).await;
    let api = Api::new(addr);
    let path = format!("/api/hubs/chat/:send?{V}");
    let url = format!("http://{addr}{path}");
    let post = |token: Option<String>| {
        let api = api.clone();
        let url = url.clone();
        async move {
            api.raw(
                "POST",
                &url,
                token.as_deref(),
                Some("text/plain"),
                b"x".to_vec(),
            )
            .await
        }
    };
    let e = post(None).await.error(401);
    assert_eq!(e["code"], "Unauthorized");
    post(Some(rest_token(&url, "wrong-key"))).await.error(401);
    post(Some(rest_token(
        &format!("http://{addr}/api/hubs/other/:send?{V}"),
        KEY,
    )))
    .await
    .error(401);
    post(Some("not-a-jwt".into())).await.error(401);

    assert_eq!(post(Some(rest_token(&url, KEY))).await.status, 202);
    assert_eq!(
        post(Some(rest_token(&url, "secondary-key"))).await.status,
        202,
        "the secondary key works too"
    );
    let without_query = format!("http://{addr}/api/hubs/chat/:send");
    assert_eq!(
        post(Some(rest_token(&without_query, KEY))).await.status,
        202
    );
    let other_host_upper = format!("https://PROXY.example{}", path.to_uppercase());
    assert_eq!(
        post(Some(rest_token(&other_host_upper, KEY))).await.status,
        202,
        "scheme and host are not compared, path and query case-insensitively"
    );
}

#[tokio::test]
async fn send_to_all_maps_content_types_to_data_types() {
    let addr = start(Limits::default()).await;
    let api = Api::new(addr);
    let (mut json_client, _) = client(addr, None, &[], Some(JSON)).await;
    let (mut raw_client, _) = client(addr, None, &[], None).await;
    let path = format!("/api/hubs/chat/:send?{V}");

    let r = api.post(&path, "text/plain", b"hello").await;
    assert_eq!((r.status.as_u16(), r.body.as_str()), (202, ""));
    assert_eq!(
        recv(&mut json_client).await,
        json!({"type":"message","from":"server","dataType":"text","data":"hello"})
    );
    assert_eq!(
        next_frame(&mut raw_client).await,
        Some(Message::text("hello"))
    );

    let r = api
        .post(&path, "application/json; charset=utf-8", br#"{"x":1}"#)
        .await;
    assert_eq!(r.status, 202);
    assert_eq!(
        recv(&mut json_client).await,
        json!({"type":"message","from":"server","dataType":"json","data":{"x":1}})
    );
    assert_eq!(
        next_frame(&mut raw_client).await,
        Some(Message::text(r#"{"x":1}"#))
    );

    let r = api
        .send(
            "POST",
            &path,
            Some("application/octet-stream"),
            vec![1, 2, 3],
        )
        .await;
    assert_eq!(r.status, 202);
    assert_eq!(
        recv(&mut json_client).await,
        json!({"type":"message","from":"server","dataType":"binary","data":"AQID"})
    );
    assert_eq!(
        next_frame(&mut raw_client).await,
        Some(Message::binary(vec![1, 2, 3]))
    );
}

#[tokio::test]
async fn excluded_and_filter_select_connections() {
    let addr = start(Limits::default()).await;
    let api = Api::new(addr);
    let (mut a, ca) = client(addr, Some("user1"), &["groupA"], Some(JSON)).await;
    let (mut b, cb) = client(addr, None, &["groupA", "groupB"], Some(JSON)).await;
    let (mut c, _) = client(addr, Some("user3"), &[], Some(JSON)).await;
    let ida = ca["connectionId"].as_str().unwrap();
    let idb = cb["connectionId"].as_str().unwrap();

    let send = |query: String, text: &'static str| {
        let api = api.clone();
        async move {
            api.send(
                "POST",
                &format!("/api/hubs/chat/:send?{V}&{query}"),
                Some("text/plain"),
                text.as_bytes().to_vec(),
            )
            .await
        }
    };
    let data = |v: serde_json::Value| v["data"].as_str().unwrap().to_owned();

    assert_eq!(
        send(format!("excluded={ida}&excluded={idb}"), "only c")
            .await
            .status,
        202
    );
    assert_eq!(data(recv(&mut c).await), "only c");
    let f = "filter=userId%20eq%20null";
    assert_eq!(send(f.into(), "only b").await.status, 202);
    assert_eq!(data(recv(&mut b).await), "only b");
    let f = "filter='groupA'%20in%20groups%20and%20not('groupB'%20in%20groups)";
    assert_eq!(send(f.into(), "only a").await.status, 202);
    assert_eq!(data(recv(&mut a).await), "only a");
    let f = format!("filter=connectionId%20ne%20'{ida}'&excluded={idb}");
    assert_eq!(send(f, "c again").await.status, 202);
    assert_eq!(data(recv(&mut c).await), "c again");

    for ws in [&mut a, &mut b, &mut c] {
        assert!(sync(ws).await.is_empty(), "nothing else was delivered");
    }
}

#[tokio::test]
async fn group_user_and_connection_sends() {
    let addr = start(Limits::default()).await;
    let api = Api::new(addr);
    let (mut a, ca) = client(addr, Some("alice"), &["g"], Some(JSON)).await;
    let (mut b, _) = client(addr, Some("bob"), &[], Some(RELIABLE)).await;
    let ida = ca["connectionId"].as_str().unwrap();

    let r = api
        .post(
            &format!("/api/hubs/chat/groups/g/:send?{V}"),
            "text/plain",
            b"to g",
        )
        .await;
    assert_eq!(r.status, 202);
    assert_eq!(
        recv(&mut a).await,
        json!({"type":"message","from":"group","group":"g","dataType":"text","data":"to g"})
    );
    let r = api
        .post(
            &format!("/api/hubs/chat/users/bob/:send?{V}"),
            "application/json",
            b"[1]",
        )
        .await;
    assert_eq!(r.status, 202);
    assert_eq!(
        recv(&mut b).await,
        json!({"type":"message","from":"server","dataType":"json","data":[1],"sequenceId":1})
    );
    let r = api
        .post(
            &format!("/api/hubs/chat/connections/{ida}/:send?{V}"),
            "text/plain",
            b"direct",
        )
        .await;
    assert_eq!(r.status, 202);
    assert_eq!(recv(&mut a).await["data"], "direct");

    for path in [
        "/api/hubs/chat/connections/xxxx/:send",
        "/api/hubs/chat/users/nobody/:send",
        "/api/hubs/chat/groups/empty/:send",
    ] {
        let r = api.post(&format!("{path}?{V}"), "text/plain", b"x").await;
        assert_eq!(r.status, 202, "{path}: a missing target is not an error");
    }
    let r = api
        .post(
            &format!("/api/hubs/chat/groups/g/:send?{V}&excluded={ida}"),
            "text/plain",
            b"x",
        )
        .await;
    assert_eq!(r.status, 202);
    assert!(sync(&mut a).await.is_empty());
}

#[tokio::test]
async fn bad_sends_get_the_service_error_form() {
    let addr = start(Limits {
        max_frame_bytes: 1000,
        ..Limits::default()
    })
    .await;
    let api = Api::new(addr);
    let send = format!("/api/hubs/chat/:send?{V}");
    for path in [
        format!("/api/hubs/chat/:send?{V}&filter=invalid%20filter"),
        format!("/api/hubs/chat/groups/g/:send?{V}&filter=invalid%20filter"),
        format!("/api/hubs/chat/users/u/:send?{V}&filter=invalid%20filter"),
    ] {
        let e = api.post(&path, "text/plain", b"x").await.error(400);
        assert_eq!(e["message"], INVALID_FILTER, "{path}");
    }
    api.post(&send, "application/json", b"{nope")
        .await
        .error(400);
    api.send("POST", &send, Some("text/plain"), vec![0xff, 0xfe])
        .await
        .error(400);
    let e = api
        .send("POST", &send, Some("image/png"), vec![1])
        .await
        .error(415);
    assert_eq!(e["code"], "UnsupportedMediaType");
    api.send("POST", &send, Some("text/plain"), vec![b'a'; 1001])
        .await
        .error(413);
    assert_eq!(
        api.send("POST", &send, Some("text/plain"), vec![b'a'; 1000])
            .await
            .status,
        202
    );
    api.post(&format!("{send}&messageTtlSeconds=301"), "text/plain", b"x")
        .await
        .error(400);
    api.send(
        "POST",
        "/api/hubs/chat/:send",
        Some("text/plain"),
        b"x".to_vec(),
    )
    .await
    .error(400);
    api.post(&format!("/api/hubs/1chat/:send?{V}"), "text/plain", b"x")
        .await
        .error(400);
    api.send("POST", &format!("/api/hubs/chat/:nope?{V}"), None, vec![])
        .await
        .error(404);
    api.post(
        &format!("/api/hubs/chat/groups/%20/:send?{V}"),
        "text/plain",
        b"x",
    )
    .await
    .error(400);
    api.call("GET", &format!("/api/nothing?{V}"))
        .await
        .error(404);
}
