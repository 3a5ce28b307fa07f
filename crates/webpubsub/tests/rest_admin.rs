//! The REST API on a real socket, part 2: groups, users, connections, closing,
//! permissions, listing and token generation, with the status codes the server SDKs
//! check.

mod common;

use std::collections::HashSet;

use common::api::{client, rest_token, Api, V};
use common::*;
use serde_json::{json, Value};
use statehub_webpubsub::Limits;

const INVALID_FILTER: &str = "Invalid syntax for 'invalid filter': Syntax error at position 14 in 'invalid filter'. (Parameter 'filter')";

fn id(connected: &Value) -> String {
    connected["connectionId"].as_str().unwrap().to_owned()
}

async fn status(api: &Api, method: &str, path: &str) -> u16 {
    api.call(method, &format!("{path}?{V}"))
        .await
        .status
        .as_u16()
}

#[tokio::test]
async fn connection_membership_and_existence() {
    let addr = start(Limits::default()).await;
    let api = Api::new(addr);
    let (mut ws, c) = client(addr, Some("u"), &[], Some(JSON)).await;
    let cid = id(&c);
    let conn = format!("/api/hubs/chat/connections/{cid}");
    let member = format!("/api/hubs/chat/groups/g/connections/{cid}");

    assert_eq!(status(&api, "HEAD", &conn).await, 200);
    assert_eq!(
        status(&api, "HEAD", "/api/hubs/chat/connections/xxx").await,
        404
    );
    assert_eq!(status(&api, "HEAD", "/api/hubs/chat/groups/g").await, 404);
    assert_eq!(status(&api, "PUT", &member).await, 200);
    assert_eq!(status(&api, "HEAD", "/api/hubs/chat/groups/g").await, 200);
    api.post(
        &format!("/api/hubs/chat/groups/g/:send?{V}"),
        "text/plain",
        b"in g",
    )
    .await;
    assert_eq!(recv(&mut ws).await["data"], "in g");
    assert_eq!(status(&api, "DELETE", &member).await, 204);
    assert_eq!(status(&api, "HEAD", "/api/hubs/chat/groups/g").await, 404);
    assert_eq!(status(&api, "DELETE", &member).await, 204, "idempotent");

    let e = api
        .call(
            "PUT",
            &format!("/api/hubs/chat/groups/g/connections/xxxx?{V}"),
        )
        .await
        .error(404);
    assert_eq!(e["code"], "NotFound");
    assert_eq!(
        status(&api, "DELETE", "/api/hubs/chat/groups/g/connections/xxxx").await,
        204
    );

    status(&api, "PUT", &member).await;
    status(
        &api,
        "PUT",
        &format!("/api/hubs/chat/groups/h/connections/{cid}"),
    )
    .await;
    assert_eq!(status(&api, "DELETE", &format!("{conn}/groups")).await, 204);
    assert_eq!(status(&api, "HEAD", "/api/hubs/chat/groups/g").await, 404);
    assert_eq!(status(&api, "HEAD", "/api/hubs/chat/groups/h").await, 404);
    assert_eq!(
        status(&api, "DELETE", "/api/hubs/chat/connections/xxx/groups").await,
        204
    );
}

#[tokio::test]
async fn user_membership_and_existence() {
    let addr = start(Limits::default()).await;
    let api = Api::new(addr);
    let (mut a1, _) = client(addr, Some("alice"), &[], Some(JSON)).await;
    let (mut a2, _) = client(addr, Some("alice"), &["x"], Some(JSON)).await;

    assert_eq!(
        status(&api, "HEAD", "/api/hubs/chat/users/alice").await,
        200
    );
    assert_eq!(status(&api, "HEAD", "/api/hubs/chat/users/foo").await, 404);
    assert_eq!(
        status(&api, "PUT", "/api/hubs/chat/users/alice/groups/g").await,
        200
    );
    api.call("PUT", &format!("/api/hubs/chat/users/brian/groups/g?{V}"))
        .await
        .error(404);
    api.post(
        &format!("/api/hubs/chat/groups/g/:send?{V}"),
        "text/plain",
        b"both",
    )
    .await;
    assert_eq!(recv(&mut a1).await["data"], "both");
    assert_eq!(recv(&mut a2).await["data"], "both");
    assert_eq!(
        status(&api, "DELETE", "/api/hubs/chat/users/alice/groups/g").await,
        204
    );
    assert_eq!(status(&api, "HEAD", "/api/hubs/chat/groups/g").await, 404);
    assert_eq!(
        status(&api, "DELETE", "/api/hubs/chat/users/brian/groups/g").await,
        204
    );
    assert_eq!(
        status(&api, "DELETE", "/api/hubs/chat/users/alice/groups").await,
        204
    );
    assert_eq!(status(&api, "HEAD", "/api/hubs/chat/groups/x").await, 404);
    assert_eq!(
        status(&api, "DELETE", "/api/hubs/chat/users/brian/groups").await,
        204
    );
}

#[tokio::test]
async fn closing_sends_disconnected_with_the_reason() {
    let addr = start(Limits::default()).await;
    let api = Api::new(addr);
    let t = |u: &str, g: &[&str]| token(addr, "chat", Some(u), &[], g);
    let (mut one, c1) = connect(addr, "chat", &t("u1", &[]), Some(JSON)).await;
    let (mut rel, _) = connect(addr, "chat", &t("u2", &["g"]), Some(RELIABLE)).await;
    let (mut kept, ck) = connect(addr, "chat", &t("u2", &["g"]), Some(JSON)).await;
    let (mut all, _) = connect(addr, "chat", &t("u3", &[]), Some(JSON)).await;

    let r = api
        .call(
            "DELETE",
            &format!(
                "/api/hubs/chat/connections/{}?{V}&reason=bye%20now",
                id(&c1)
            ),
        )
        .await;
    assert_eq!(r.status, 204);
    assert_eq!(
        recv(&mut one).await,
        json!({"type":"system","event":"disconnected","message":"bye now"})
    );
    assert_eq!(close_code(&mut one).await, Some(1000));
    assert_eq!(
        status(
            &api,
            "HEAD",
            &format!("/api/hubs/chat/connections/{}", id(&c1))
        )
        .await,
        404
    );
    assert_eq!(
        status(&api, "DELETE", "/api/hubs/chat/connections/gone").await,
        204
    );

    let r = api
        .call(
            "POST",
            &format!(
                "/api/hubs/chat/groups/g/:closeConnections?{V}&excluded={}&reason=group",
                id(&ck)
            ),
        )
        .await;
    assert_eq!(r.status, 204);
    assert_eq!(recv(&mut rel).await["message"], "group");
    assert_eq!(
        close_code(&mut rel).await,
        Some(1008),
        "a reliable client must not try to recover"
    );
    assert!(sync(&mut kept).await.is_empty());

    let r = api
        .call(
            "POST",
            &format!("/api/hubs/chat/users/u2/:closeConnections?{V}"),
        )
        .await;
    assert_eq!(r.status, 204);
    assert_eq!(recv(&mut kept).await["event"], "disconnected");
    assert_eq!(close_code(&mut kept).await, Some(1000));

    let r = api
        .call(
            "POST",
            &format!("/api/hubs/chat/:closeConnections?{V}&reason=all"),
        )
        .await;
    assert_eq!(r.status, 204);
    assert_eq!(recv(&mut all).await["message"], "all");
    assert_eq!(status(&api, "HEAD", "/api/hubs/chat/users/u3").await, 404);
}

#[tokio::test]
async fn permissions_change_what_a_client_may_do() {
    let addr = start(Limits::default()).await;
    let api = Api::new(addr);
    let (mut ws, c) = client(addr, Some("u"), &[], Some(JSON)).await;
    let perm = |p: &str, q: &str| {
        format!(
            "/api/hubs/chat/permissions/{p}/connections/{}?{V}{q}",
            id(&c)
        )
    };

    let join = |ack: u64| json!({"type":"joinGroup","group":"g","ackId":ack});
    send(&mut ws, join(1)).await;
    assert_eq!(recv(&mut ws).await["error"]["name"], "Forbidden");

    assert_eq!(
        api.call("HEAD", &perm("joinLeaveGroup", "&targetName=g"))
            .await
            .status,
        404
    );
    assert_eq!(
        api.call("PUT", &perm("joinLeaveGroup", "&targetName=g"))
            .await
            .status,
        200
    );
    assert_eq!(
        api.call("HEAD", &perm("joinLeaveGroup", "&targetName=g"))
            .await
            .status,
        200
    );
    assert_eq!(
        api.call("HEAD", &perm("joinLeaveGroup", "")).await.status,
        404,
        "not all groups"
    );
    send(&mut ws, join(2)).await;
    assert_eq!(recv(&mut ws).await["success"], true);

    assert_eq!(
        api.call("DELETE", &perm("joinLeaveGroup", "&targetName=g"))
            .await
            .status,
        204
    );
    send(&mut ws, json!({"type":"leaveGroup","group":"g","ackId":3})).await;
    assert_eq!(recv(&mut ws).await["error"]["name"], "Forbidden");

    assert_eq!(api.call("PUT", &perm("sendToGroup", "")).await.status, 200);
    assert_eq!(
        api.call("HEAD", &perm("SENDTOGROUP", "&targetName=any"))
            .await
            .status,
        200
    );
    assert_eq!(api.call("HEAD", &perm("sendToGroup", "")).await.status, 200);

    let missing =
        format!("/api/hubs/chat/permissions/joinLeaveGroup/connections/xxx?{V}&targetName=x");
    api.call("PUT", &missing).await.error(404);
    assert_eq!(api.call("DELETE", &missing).await.status, 204);
    assert_eq!(api.call("HEAD", &missing).await.status, 404);
    api.call("PUT", &perm("admin", "")).await.error(400);
}

#[tokio::test]
async fn filtered_add_and_remove_to_groups() {
    let addr = start(Limits::default()).await;
    let api = Api::new(addr);
    let (mut l, _) = client(addr, Some("listener-1"), &[], Some(JSON)).await;
    let (mut o, _) = client(addr, Some("other"), &[], Some(JSON)).await;
    let body =
        |f: &str| serde_json::to_vec(&json!({"groups":["group1","group2"],"filter":f})).unwrap();

    let add = format!("/api/hubs/chat/:addToGroups?{V}");
    let r = api
        .send(
            "POST",
            &add,
            Some("application/json"),
            body("startswith(userId, 'listener-')"),
        )
        .await;
    assert_eq!((r.status.as_u16(), r.body.as_str()), (200, ""));
    api.post(
        &format!("/api/hubs/chat/groups/group2/:send?{V}"),
        "text/plain",
        b"x",
    )
    .await;
    assert_eq!(recv(&mut l).await["group"], "group2");
    assert!(sync(&mut o).await.is_empty());

    let remove = format!("/api/hubs/chat/:removeFromGroups?{V}");
    let r = api
        .send(
            "POST",
            &remove,
            Some("application/json"),
            body("userId eq 'listener-1'"),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        status(&api, "HEAD", "/api/hubs/chat/groups/group1").await,
        404
    );

    for path in [&add, &remove] {
        let e = api
            .send(
                "POST",
                path,
                Some("application/json"),
                body("invalid filter"),
            )
            .await
            .error(400);
        assert_eq!(e["message"], INVALID_FILTER);
        api.post(path, "application/json", br#"{"groups":"g"}"#)
            .await
            .error(400);
        api.post(path, "application/json", b"not json")
            .await
            .error(400);
    }
}

/// Follows `nextLink`s as the JS SDK does: the absolute URL as is, signed for itself.
async fn list_pages(api: &Api, query: &str) -> Vec<usize> {
    let mut url = format!(
        "http://{}/api/hubs/chat/groups/group1/connections?{V}{query}",
        api.addr
    );
    let mut pages = Vec::new();
    let mut seen = HashSet::new();
    loop {
        let r = api
            .raw("GET", &url, Some(&rest_token(&url, KEY)), None, vec![])
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let value = v["value"].as_array().unwrap();
        for m in value {
            assert!(
                seen.insert(m["connectionId"].as_str().unwrap().to_owned()),
                "no repeats"
            );
            assert!(m["userId"].as_str().is_some_and(|u| u.starts_with("user")));
        }
        pages.push(value.len());
        match v["nextLink"].as_str() {
            Some(next) => url = next.to_owned(),
            None => return pages,
        }
    }
}

#[tokio::test]
async fn listing_pages_as_the_sdk_tests_expect() {
    let addr = start(Limits::default()).await;
    let api = Api::new(addr);
    let mut clients = Vec::new();
    for i in 0..6 {
        let t = token(addr, "chat", Some(&format!("user{i}")), &[], &["group1"]);
        clients.push(connect(addr, "chat", &t, None).await);
    }
    assert_eq!(list_pages(&api, "&top=6").await, [6]);
    assert_eq!(list_pages(&api, "&top=3").await, [3]);
    assert_eq!(list_pages(&api, "&maxpagesize=2").await, [2, 2, 2]);
    assert_eq!(list_pages(&api, "&top=5&maxpagesize=2").await, [2, 2, 1]);
    assert_eq!(list_pages(&api, "").await, [6]);

    let r = api
        .call(
            "GET",
            &format!("/api/hubs/chat/groups/empty/connections?{V}"),
        )
        .await;
    assert_eq!(r.json(), json!({"value": []}));
    api.call(
        "GET",
        &format!("/api/hubs/chat/groups/group1/connections?{V}&maxpagesize=201"),
    )
    .await
    .error(400);
    api.call(
        "GET",
        &format!("/api/hubs/chat/groups/group1/connections?{V}&continuationToken=***"),
    )
    .await
    .error(400);
}

#[tokio::test]
async fn generated_tokens_connect() {
    let addr = start(Limits::default()).await;
    let api = Api::new(addr);
    let q = "&userId=brian&role=webpubsub.joinLeaveGroup&role=webpubsub.sendToGroup&group=g1&minutesToExpire=5";
    let r = api
        .call("POST", &format!("/api/hubs/chat/:generateToken?{V}{q}"))
        .await;
    assert_eq!(r.status, 200);
    let t = r.json()["token"].as_str().unwrap().to_owned();
    let (mut ws, c) = connect(addr, "chat", &t, Some(JSON)).await;
    assert_eq!(c["userId"], "brian");
    assert_eq!(
        status(&api, "HEAD", "/api/hubs/chat/groups/g1").await,
        200,
        "initial group joined"
    );
    send(
        &mut ws,
        json!({"type":"sendToGroup","group":"g2","ackId":1,"data":1}),
    )
    .await;
    assert_eq!(recv(&mut ws).await["success"], true, "roles granted");

    let r = api
        .call(
            "POST",
            &format!("/api/hubs/chat/:generateToken?{V}&clientType=mqtt"),
        )
        .await;
    assert_eq!(r.status, 200);
    api.call(
        "POST",
        &format!("/api/hubs/chat/:generateToken?{V}&minutesToExpire=0"),
    )
    .await
    .error(400);
    api.call(
        "POST",
        &format!("/api/hubs/chat/:generateToken?{V}&clientType=socketio"),
    )
    .await
    .error(400);
}
