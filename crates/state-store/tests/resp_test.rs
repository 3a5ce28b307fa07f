//! Request framing and command parsing: which malformed input gets which error.

use bytes::Bytes;
use statehub_state_store::resp::{encode_array, parse_request, Response};
use statehub_state_store::{Command, Refusal, SetCondition};

fn parse(payload: &[u8]) -> Result<Command, Refusal> {
    Command::parse(&Bytes::copy_from_slice(payload))
}

fn b(s: &'static [u8]) -> Bytes {
    Bytes::from_static(s)
}

#[test]
fn page_examples_parse() {
    assert_eq!(
        parse(b"*3\r\n$3\r\nset\r\n$7\r\nSETKEY2\r\n$6\r\nVALUE5\r\n"),
        Ok(Command::Set {
            key: b(b"SETKEY2"),
            value: b(b"VALUE5"),
            condition: SetCondition::Always,
            px_ms: None
        })
    );
    assert_eq!(
        parse(b"*2\r\n$3\r\nget\r\n$7\r\nSETKEY2\r\n"),
        Ok(Command::Get { key: b(b"SETKEY2") })
    );
    assert_eq!(
        parse(b"*2\r\n$3\r\ndel\r\n$7\r\nSETKEY2\r\n"),
        Ok(Command::Del { key: b(b"SETKEY2") })
    );
    assert_eq!(
        parse(b"*3\r\n$4\r\nvdel\r\n$7\r\nSETKEY2\r\n$3\r\nABC\r\n"),
        Ok(Command::VDel {
            key: b(b"SETKEY2"),
            value: b(b"ABC")
        })
    );
    assert_eq!(
        parse(b"*2\r\n$9\r\nKEYNOTIFY\r\n$7\r\nSOMEKEY\r\n"),
        Ok(Command::KeyNotify {
            key: b(b"SOMEKEY"),
            stop: false
        })
    );
}

#[test]
fn sdk_serializations_parse() {
    assert_eq!(
        parse(b"*6\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$3\r\nNEX\r\n$2\r\nPX\r\n$2\r\n10\r\n"),
        Ok(Command::Set { key: b(b"testkey"), value: b(b"testvalue"), condition: SetCondition::IfAbsentOrEqual, px_ms: Some(10) })
    );
    assert_eq!(
        parse(b"*4\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$2\r\nNX\r\n"),
        Ok(Command::Set {
            key: b(b"testkey"),
            value: b(b"testvalue"),
            condition: SetCondition::IfAbsent,
            px_ms: None
        })
    );
    assert_eq!(
        parse(b"*3\r\n$9\r\nKEYNOTIFY\r\n$7\r\ntestkey\r\n$4\r\nSTOP\r\n"),
        Ok(Command::KeyNotify {
            key: b(b"testkey"),
            stop: true
        })
    );
    assert_eq!(
        parse(b"*2\r\n$4\r\nSCAN\r\n$4\r\nkey*\r\n"),
        Ok(Command::Scan {
            pattern: b(b"key*"),
            token: None
        })
    );
    assert_eq!(
        parse(b"*3\r\n$4\r\nSCAN\r\n$4\r\nkey*\r\n$3\r\n\x00\xffx\r\n"),
        Ok(Command::Scan {
            pattern: b(b"key*"),
            token: Some(b(b"\x00\xffx"))
        })
    );
}

#[test]
fn binary_and_empty_arguments() {
    assert_eq!(
        parse(b"*3\r\n$3\r\nSET\r\n$4\r\n\r\n\x00\xff\r\n$0\r\n\r\n"),
        Ok(Command::Set {
            key: b(b"\r\n\x00\xff"),
            value: b(b""),
            condition: SetCondition::Always,
            px_ms: None
        })
    );
    assert_eq!(
        parse(b"*3\r\n$4\r\nSCAN\r\n$1\r\n*\r\n$0\r\n\r\n"),
        Ok(Command::Scan {
            pattern: b(b"*"),
            token: None
        })
    );
}

#[test]
fn arguments_are_slices_of_the_payload() {
    let payload = Bytes::from_static(b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n");
    let args = parse_request(&payload).expect("valid");
    assert_eq!(args[1].as_ptr(), payload[17..].as_ptr());
}

#[test]
fn framing_errors_are_syntax_errors() {
    let cases: &[&[u8]] = &[
        b"",
        b"GET key\r\n",
        b"*",
        b"*\r\n",
        b"*0\r\n",
        b"*-1\r\n",
        b"*1",
        b"*1\r\n",
        b"*1\r\n+GET\r\n",
        b"*1\r\n$-1\r\n",
        b"*1\r\n$3\r\nGE\r\n",
        b"*1\r\n$3\r\nGETT\r\n",
        b"*1\r\n$3\r\nGET",
        b"*1\r\n$3\r\nGET\r",
        b"*1\r\n$3\nGET\r\n",
        b"*1 \r\n$3\r\nGET\r\n",
        b"*1\r\n$+3\r\nGET\r\n",
        b"*2\r\n$3\r\nGET\r\n",
        b"*1\r\n$3\r\nGET\r\ntrailing",
        b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n*1\r\n",
        b"*1\r\n$99999999999999999999999\r\nGET\r\n",
        b"*99999999999999999999999\r\n$3\r\nGET\r\n",
        b"*1152921504606846976\r\n$3\r\nGET\r\n",
        b"*1\r\n*1\r\n$3\r\nGET\r\n",
    ];
    for case in cases {
        assert_eq!(
            parse(case),
            Err(Refusal::Syntax),
            "{:?}",
            String::from_utf8_lossy(case)
        );
    }
}

#[test]
fn unknown_verbs() {
    for verb in [
        &b"PING"[..],
        b"SETX",
        b"GETDEL",
        b"",
        b"KEYNOTIFYX",
        b"HSET",
    ] {
        assert_eq!(
            parse(&common_resp(&[verb, b"k"])),
            Err(Refusal::UnknownCommand)
        );
    }
}

#[test]
fn verbs_and_options_are_case_insensitive() {
    assert_eq!(
        parse(&common_resp(&[b"sEt", b"k", b"v", b"nex", b"px", b"5"])),
        Ok(Command::Set {
            key: b(b"k"),
            value: b(b"v"),
            condition: SetCondition::IfAbsentOrEqual,
            px_ms: Some(5)
        })
    );
    assert_eq!(
        parse(&common_resp(&[b"keynotify", b"k", b"stop"])),
        Ok(Command::KeyNotify {
            key: b(b"k"),
            stop: true
        })
    );
}

#[test]
fn argument_counts() {
    let wrong: &[&[&[u8]]] = &[
        &[b"SET"],
        &[b"SET", b"k"],
        &[b"GET"],
        &[b"GET", b"k", b"x"],
        &[b"DEL"],
        &[b"DEL", b"k", b"x"],
        &[b"VDEL", b"k"],
        &[b"VDEL", b"k", b"v", b"x"],
        &[b"KEYNOTIFY"],
        &[b"KEYNOTIFY", b"k", b"STOP", b"x"],
        &[b"SCAN"],
        &[b"SCAN", b"*", b"t", b"x"],
    ];
    for args in wrong {
        assert_eq!(
            parse(&common_resp(args)),
            Err(Refusal::WrongNumberOfArguments),
            "{args:?}"
        );
    }
    // The argument count is checked before the key.
    assert_eq!(
        parse(&common_resp(&[b"GET", b"", b"x"])),
        Err(Refusal::WrongNumberOfArguments)
    );
}

#[test]
fn empty_keys() {
    for args in [
        &[&b"SET"[..], b"", b"v"][..],
        &[b"SET", b"", b"v", b"BOGUS"],
        &[b"GET", b""],
        &[b"DEL", b""],
        &[b"VDEL", b"", b"v"],
        &[b"KEYNOTIFY", b""],
        &[b"KEYNOTIFY", b"", b"STOP"],
    ] {
        assert_eq!(
            parse(&common_resp(args)),
            Err(Refusal::KeyLengthZero),
            "{args:?}"
        );
    }
}

#[test]
fn bad_options_are_syntax_errors() {
    let bad: &[&[&[u8]]] = &[
        &[b"SET", b"k", b"v", b"XX"],
        &[b"SET", b"k", b"v", b"NX", b"NX"],
        &[b"SET", b"k", b"v", b"NX", b"NEX"],
        &[b"SET", b"k", b"v", b"PX"],
        &[b"SET", b"k", b"v", b"PX", b"0"],
        &[b"SET", b"k", b"v", b"PX", b"-5"],
        &[b"SET", b"k", b"v", b"PX", b"+5"],
        &[b"SET", b"k", b"v", b"PX", b"1.5"],
        &[b"SET", b"k", b"v", b"PX", b""],
        &[b"SET", b"k", b"v", b"PX", b"18446744073709551616"],
        &[b"SET", b"k", b"v", b"PX", b"5", b"PX", b"6"],
        &[b"SET", b"k", b"v", b"EX", b"5"],
        &[b"KEYNOTIFY", b"k", b"GO"],
    ];
    for args in bad {
        assert_eq!(parse(&common_resp(args)), Err(Refusal::Syntax), "{args:?}");
    }
    assert!(parse(&common_resp(&[
        b"SET",
        b"k",
        b"v",
        b"PX",
        b"18446744073709551615"
    ]))
    .is_ok());
    assert!(parse(&common_resp(&[b"SET", b"k", b"v", b"PX", b"7", b"NX"])).is_ok());
}

#[test]
fn response_encodings() {
    assert_eq!(&Response::Ok.encode()[..], b"+OK\r\n");
    assert_eq!(&Response::Integer(1).encode()[..], b":1\r\n");
    assert_eq!(&Response::Integer(0).encode()[..], b":0\r\n");
    assert_eq!(&Response::Integer(-1).encode()[..], b":-1\r\n");
    assert_eq!(&Response::Integer(42).encode()[..], b":42\r\n");
    assert_eq!(&Response::Null.encode()[..], b"$-1\r\n");
    assert_eq!(&Response::Bulk(b(b"1234")).encode()[..], b"$4\r\n1234\r\n");
    assert_eq!(&Response::Bulk(b(b"")).encode()[..], b"$0\r\n\r\n");
    assert_eq!(
        &Response::Error(Refusal::Syntax).encode()[..],
        b"-ERR syntax error\r\n"
    );
    assert_eq!(
        &Response::Scan {
            keys: vec![b(b"key1"), b(b"key2")],
            token: None
        }
        .encode()[..],
        b"*1\r\n*2\r\n$4\r\nkey1\r\n$4\r\nkey2\r\n"
    );
    assert_eq!(
        &Response::Scan {
            keys: vec![],
            token: Some(b(b"\x00\xffx"))
        }
        .encode()[..],
        b"*2\r\n*0\r\n$3\r\n\x00\xffx\r\n"
    );
    assert_eq!(
        &encode_array(&[b"NOTIFY", b"DELETE"])[..],
        b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"
    );
}

fn common_resp(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}
