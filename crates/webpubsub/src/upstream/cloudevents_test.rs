use serde_json::json;

use super::*;

#[test]
fn signatures_are_hex_hmac_per_key() {
    // HMAC-SHA256("key", "The quick brown fox jumps over the lazy dog"), RFC 4231-style
    // known value.
    assert_eq!(
        signature(
            &["key".into()],
            "The quick brown fox jumps over the lazy dog"
        ),
        "sha256=f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
    );
    let two = signature(&["a".into(), "b".into()], "conn");
    let parts: Vec<&str> = two.split(',').collect();
    assert_eq!(parts.len(), 2);
    assert!(parts
        .iter()
        .all(|p| p.starts_with("sha256=") && p.len() == 7 + 64));
    assert_ne!(parts[0], parts[1]);
}

#[test]
fn event_headers() {
    let ctx = EventContext {
        hub: "chat",
        connection_id: "c1",
        user_id: Some("u1"),
        subprotocol: Some("json.webpubsub.azure.v1"),
        connection_state: Some("eyJ4IjoxfQ=="),
        event: Event::User("hello"),
    };
    let h = headers(
        &ctx,
        "localhost:8080",
        &["k".into()],
        "id-1",
        "2024-01-01T00:00:00Z",
    );
    let get = |n: &str| {
        h.iter()
            .find(|(k, _)| k.as_str() == n)
            .map(|(_, v)| v.to_str().unwrap().to_owned())
    };
    assert_eq!(
        get("ce-type").as_deref(),
        Some("azure.webpubsub.user.hello")
    );
    assert_eq!(get("ce-source").as_deref(), Some("/hubs/chat/client/c1"));
    assert_eq!(get("ce-specversion").as_deref(), Some("1.0"));
    assert_eq!(get("ce-awpsversion").as_deref(), Some("1.0"));
    assert_eq!(get("ce-hub").as_deref(), Some("chat"));
    assert_eq!(get("ce-connectionid").as_deref(), Some("c1"));
    assert_eq!(get("ce-userid").as_deref(), Some("u1"));
    assert_eq!(get("ce-eventname").as_deref(), Some("hello"));
    assert_eq!(
        get("ce-subprotocol").as_deref(),
        Some("json.webpubsub.azure.v1")
    );
    assert_eq!(get("ce-connectionstate").as_deref(), Some("eyJ4IjoxfQ=="));
    assert_eq!(
        get("webhook-request-origin").as_deref(),
        Some("localhost:8080")
    );
    assert_eq!(get("ce-id").as_deref(), Some("id-1"));
    assert_eq!(get("ce-time").as_deref(), Some("2024-01-01T00:00:00Z"));
    assert!(get("ce-signature").is_some());

    let anon = EventContext {
        user_id: Some("bad\nuser"),
        subprotocol: None,
        connection_state: None,
        event: Event::System(SystemEvent::Connect),
        ..ctx
    };
    let h = headers(&anon, "o", &[], "i", "t");
    assert!(h
        .iter()
        .all(|(k, _)| k != "ce-userid" && k != "ce-subprotocol"));
    assert!(h
        .iter()
        .any(|(k, v)| k == "ce-type" && v == "azure.webpubsub.sys.connect"));
}

#[test]
fn connect_answers() {
    assert_eq!(connect_response(204, b""), Ok(ConnectResponse::default()));
    assert_eq!(connect_response(200, b""), Ok(ConnectResponse::default()));
    let r = connect_response(
        200,
        br#"{"userId":"u","groups":["g"],"roles":["r"],"subprotocol":"p"}"#,
    )
    .unwrap();
    assert_eq!(r.user_id.as_deref(), Some("u"));
    assert_eq!(
        (r.groups, r.roles),
        (vec!["g".to_owned()], vec!["r".to_owned()])
    );
    assert_eq!(r.subprotocol.as_deref(), Some("p"));
    let e = connect_response(401, b"nope").unwrap_err();
    assert_eq!(e.handshake_status(), 401);
    assert_eq!(
        connect_response(503, b"").unwrap_err().handshake_status(),
        503
    );
    assert_eq!(
        connect_response(200, b"{").unwrap_err().handshake_status(),
        500
    );
}

#[test]
fn user_event_answers() {
    assert_eq!(user_event_response(204, None, b""), Ok(None));
    assert_eq!(user_event_response(200, None, b""), Ok(None));
    assert_eq!(
        user_event_response(200, Some("text/plain; charset=utf-8"), b"hi"),
        Ok(Some(Payload::Text("hi".into())))
    );
    assert_eq!(
        user_event_response(200, Some("application/json"), b"{\"a\":1}"),
        Ok(Some(Payload::Json(json!({"a":1}))))
    );
    assert_eq!(
        user_event_response(200, Some("application/octet-stream"), &[1, 2]),
        Ok(Some(Payload::Binary(vec![1, 2])))
    );
    assert_eq!(
        user_event_response(200, None, &[1]),
        Ok(Some(Payload::Binary(vec![1])))
    );
    let e = user_event_response(500, None, b"boom").unwrap_err();
    assert_eq!(EventError::from(e).name(), "InternalServerError");
    let forbidden = user_event_response(403, None, b"").unwrap_err();
    assert_eq!(EventError::from(forbidden).name(), "Forbidden");
    let bad = user_event_response(400, None, b"").unwrap_err();
    assert_eq!(EventError::from(bad).name(), "BadRequest");
    assert!(user_event_response(200, Some("application/json"), b"{").is_err());
}

#[test]
fn abuse_protection_origins() {
    assert!(origin_allowed(["*"], "h:1"));
    assert!(origin_allowed(["a.example, H:1"], "h:1"));
    assert!(origin_allowed(["x", "h:1"], "h:1"));
    assert!(!origin_allowed(["x"], "h:1"));
    assert!(!origin_allowed([], "h:1"));
}

#[test]
fn bodies() {
    assert_eq!(system_body(SystemEvent::Connected, None), json!({}));
    assert_eq!(
        system_body(SystemEvent::Disconnected, Some("bye")),
        json!({"reason":"bye"})
    );
    assert_eq!(
        user_event_body(&Payload::Text("t".into())).0,
        "text/plain; charset=utf-8"
    );
    assert_eq!(
        user_event_body(&Payload::Json(json!(1))),
        ("application/json", b"1".to_vec())
    );
}
