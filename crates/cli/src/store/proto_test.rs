use bytes::Bytes;

use super::*;

fn encoded(request: Request<'_>) -> Vec<u8> {
    request.encode().to_vec()
}

#[test]
fn requests_exact_bytes() {
    assert_eq!(
        encoded(Request::Set {
            key: b"k",
            value: b"v1",
            condition: Condition::Always,
            px_ms: None
        }),
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv1\r\n"
    );
    assert_eq!(
        encoded(Request::Set {
            key: b"lock",
            value: b"me",
            condition: Condition::NotExistsOrEqual,
            px_ms: Some(1500)
        }),
        b"*6\r\n$3\r\nSET\r\n$4\r\nlock\r\n$2\r\nme\r\n$3\r\nNEX\r\n$2\r\nPX\r\n$4\r\n1500\r\n"
    );
    assert_eq!(
        encoded(Request::Set {
            key: b"k",
            value: b"",
            condition: Condition::NotExists,
            px_ms: None
        }),
        b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n$2\r\nNX\r\n"
    );
    assert_eq!(
        encoded(Request::Get { key: b"a\r\nb" }),
        b"*2\r\n$3\r\nGET\r\n$4\r\na\r\nb\r\n"
    );
    assert_eq!(
        encoded(Request::Del { key: b"k" }),
        b"*2\r\n$3\r\nDEL\r\n$1\r\nk\r\n"
    );
    assert_eq!(
        encoded(Request::VDel {
            key: b"k",
            value: &[0xff, 0]
        }),
        b"*3\r\n$4\r\nVDEL\r\n$1\r\nk\r\n$2\r\n\xff\x00\r\n"
    );
    assert_eq!(
        encoded(Request::KeyNotify {
            key: b"k",
            stop: false
        }),
        b"*2\r\n$9\r\nKEYNOTIFY\r\n$1\r\nk\r\n"
    );
    assert_eq!(
        encoded(Request::KeyNotify {
            key: b"k",
            stop: true
        }),
        b"*3\r\n$9\r\nKEYNOTIFY\r\n$1\r\nk\r\n$4\r\nSTOP\r\n"
    );
    assert_eq!(
        encoded(Request::Scan {
            pattern: b"user:*",
            token: None
        }),
        b"*2\r\n$4\r\nSCAN\r\n$6\r\nuser:*\r\n"
    );
    assert_eq!(
        encoded(Request::Scan {
            pattern: b"*",
            token: Some(b"t1")
        }),
        b"*3\r\n$4\r\nSCAN\r\n$1\r\n*\r\n$2\r\nt1\r\n"
    );
}

fn parse(bytes: &'static [u8]) -> Result<Response, Malformed> {
    Response::parse(&Bytes::from_static(bytes))
}

#[test]
fn responses() {
    assert_eq!(parse(b"+OK\r\n"), Ok(Response::Ok));
    assert_eq!(parse(b":1\r\n"), Ok(Response::Integer(1)));
    assert_eq!(parse(b":-1\r\n"), Ok(Response::Integer(-1)));
    assert_eq!(parse(b":0\r\n"), Ok(Response::Integer(0)));
    assert_eq!(parse(b"$-1\r\n"), Ok(Response::Null));
    assert_eq!(
        parse(b"$0\r\n\r\n"),
        Ok(Response::Bulk(Bytes::from_static(b"")))
    );
    assert_eq!(
        parse(b"$4\r\na\r\nb\r\n"),
        Ok(Response::Bulk(Bytes::from_static(b"a\r\nb")))
    );
    assert_eq!(
        parse(b"-ERR the quota has been exceeded\r\n"),
        Ok(Response::Error("the quota has been exceeded".into()))
    );
    assert_eq!(
        parse(b"*1\r\n*2\r\n$1\r\na\r\n$2\r\nbc\r\n"),
        Ok(Response::Scan {
            keys: vec![Bytes::from_static(b"a"), Bytes::from_static(b"bc")],
            token: None
        })
    );
    assert_eq!(
        parse(b"*2\r\n*0\r\n$3\r\ntok\r\n"),
        Ok(Response::Scan {
            keys: vec![],
            token: Some(Bytes::from_static(b"tok"))
        })
    );
    for bad in [
        &b""[..],
        b"+OK",
        b"+NO\r\n",
        b":x\r\n",
        b"$5\r\nab\r\n",
        b"$1\r\nab\r\n",
        b"$-2\r\n",
        b"+OK\r\nextra",
        b"*3\r\n*0\r\n",
        b"*1\r\n*2\r\n$1\r\na\r\n",
        b"?\r\n",
    ] {
        assert!(
            Response::parse(&Bytes::from_static(bad)).is_err(),
            "{bad:?}"
        );
    }
}

#[test]
fn notifications() {
    let set =
        Bytes::from_static(b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$2\r\nv\x00\r\n");
    assert_eq!(
        Notification::parse(&set),
        Ok(Notification::Set(Bytes::from_static(b"v\x00")))
    );
    let delete = Bytes::from_static(b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n");
    assert_eq!(Notification::parse(&delete), Ok(Notification::Delete));
    for bad in [
        &b"*2\r\n$6\r\nNOTIFY\r\n$3\r\nDEL\r\n"[..],
        b"*3\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$1\r\nv\r\n",
        b"+OK\r\n",
    ] {
        assert!(Notification::parse(&Bytes::from_static(bad)).is_err());
    }
}

#[test]
fn topics() {
    assert_eq!(
        notify_filter("cli-1"),
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C692D31/command/notify/+"
    );
    assert_eq!(
        notified_key(
            "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C692D31/command/notify/6B00FF"
        ),
        Some(vec![b'k', 0, 0xff])
    );
    assert_eq!(notified_key("clients/other/command/notify/6B"), None);
    assert_eq!(
        notified_key(
            "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/63/command/notify/6"
        ),
        None
    );
    assert_eq!(
        response_topic("a/b+"),
        "clients/612F622B/statehub-cli/statestore/response"
    );
}

#[test]
fn hlc_wire_form() {
    let t = Hlc::parse("001700000000123:00007:state-store").unwrap();
    assert_eq!(
        t,
        Hlc {
            wall_ms: 1_700_000_000_123,
            counter: 7,
            node: "state-store".into()
        }
    );
    assert_eq!(t.to_string(), "001700000000123:00007:state-store");
    assert_eq!(
        Hlc::parse("5:1:n").unwrap().to_string(),
        "000000000000005:00001:n"
    );
    for bad in ["", "1:2", "a:1:n", "1:b:n", "1:2:", "1:2:n:x", "-1:2:n"] {
        assert_eq!(Hlc::parse(bad), None, "{bad}");
    }
    assert_eq!(Hlc::now("a:b").node, "a_b");
}
