use super::*;

#[tokio::test]
async fn bounded_in_frames_and_bytes() {
    let (out, mut rx) = outbox(2, 10);
    out.push(Message::Text("12345".into())).unwrap();
    assert_eq!(
        out.push(Message::Text("123456".into())),
        Err(PushError::Full)
    );
    out.push(Message::Text("1".into())).unwrap();
    assert_eq!(out.push(Message::Text("1".into())), Err(PushError::Full));
    assert_eq!(rx.recv().await, Some(Message::Text("12345".into())));
    out.push(Message::Text("1234".into())).unwrap();
    drop(rx);
    assert_eq!(out.push(Message::Text("x".into())), Err(PushError::Closed));
}

#[tokio::test(start_paused = true)]
async fn expired_frames_are_dropped_unsent() {
    let (out, mut rx) = outbox(8, 100);
    let soon = Instant::now() + std::time::Duration::from_secs(1);
    out.push_until(Message::Text("old".into()), Some(soon))
        .unwrap();
    out.push(Message::Text("keep".into())).unwrap();
    out.push_until(
        Message::Text("fresh".into()),
        Some(soon + std::time::Duration::from_secs(9)),
    )
    .unwrap();
    tokio::time::advance(std::time::Duration::from_secs(2)).await;
    assert!(matches!(rx.next().await, Next::Frame(f) if f.msg == Message::Text("keep".into())));
    assert!(matches!(rx.next().await, Next::Frame(f) if f.msg == Message::Text("fresh".into())));
    assert_eq!(rx.queued_bytes(), 0, "dropped frames free their bytes");
}

#[tokio::test]
async fn try_frame_takes_what_is_queued_and_yields_to_a_close() {
    let (out, mut rx) = outbox(8, 100);
    assert_eq!(rx.try_frame(), None);
    out.push(Message::Text("a".into())).unwrap();
    out.push(Message::Text("b".into())).unwrap();
    assert!(matches!(rx.next().await, Next::Frame(f) if f.msg == Message::Text("a".into())));
    assert_eq!(
        rx.try_frame().map(|f| f.msg),
        Some(Message::Text("b".into()))
    );
    assert_eq!(rx.try_frame(), None);
    out.push(Message::Text("c".into())).unwrap();
    out.close(1000, "bye");
    assert_eq!(
        rx.try_frame(),
        None,
        "a pending close overtakes queued frames"
    );
    assert!(matches!(rx.next().await, Next::Close(c) if c.code == 1000));
}

#[tokio::test]
async fn ends_when_every_producer_is_gone_and_refuses_when_the_writer_is() {
    let (out, mut rx) = outbox(8, 100);
    let other = out.clone();
    out.push(Message::Text("x".into())).unwrap();
    drop(out);
    let waiter = tokio::spawn(async move {
        let first = rx.recv().await;
        let second = rx.recv().await;
        (first, second)
    });
    tokio::task::yield_now().await;
    drop(other);
    let (first, second) = waiter.await.unwrap();
    assert_eq!(first, Some(Message::Text("x".into())));
    assert_eq!(second, None);

    let (out, rx) = outbox(8, 100);
    drop(rx);
    assert_eq!(out.push(Message::Text("y".into())), Err(PushError::Closed));
}

#[tokio::test]
async fn sequence_ids_travel_with_frames_to_the_written_watermark() {
    let (out, mut rx) = outbox(8, 100);
    out.push_sequenced(Message::Text("a".into()), None, (7, 0))
        .unwrap();
    out.push(Message::Text("reply".into())).unwrap();
    assert!(matches!(
        rx.next().await,
        Next::Frame(Frame { seq: Some(7), .. })
    ));
    assert_eq!(rx.try_frame().map(|f| f.seq), Some(None));
    assert_eq!(out.written(), 0, "nothing written until the writer says so");
    rx.mark_written(7);
    rx.mark_written(3);
    assert_eq!(out.written(), 7, "the watermark never goes back");
}

/// A gate that releases what the test stores in `stored`.
fn gate(stored: &Arc<watch::Sender<u64>>) -> Gate {
    let stored = Arc::clone(stored);
    Arc::new(move |ticket| {
        let mut rx = stored.subscribe();
        Box::pin(async move { *rx.wait_for(|s| *s >= ticket).await.unwrap() })
    })
}

#[tokio::test]
async fn a_frame_waits_for_its_mirror_write_with_everything_behind_it() {
    let stored = Arc::new(watch::Sender::new(0));
    let (out, mut rx) = outbox(8, 100);
    rx.set_gate(gate(&stored));
    out.push_sequenced(Message::Text("1".into()), None, (1, 3))
        .unwrap();
    out.push(Message::Text("reply".into())).unwrap();
    out.push_sequenced(Message::Text("2".into()), None, (2, 5))
        .unwrap();
    assert_eq!(rx.try_frame(), None, "held until ticket 3 is stored");
    let next = tokio::spawn(async move {
        let first = rx.next().await;
        (rx, first)
    });
    tokio::task::yield_now().await;
    stored.send_replace(4);
    let (mut rx, first) = next.await.unwrap();
    assert!(matches!(first, Next::Frame(f) if f.seq == Some(1)));
    assert_eq!(
        rx.try_frame().map(|f| f.msg),
        Some(Message::Text("reply".into()))
    );
    assert_eq!(rx.try_frame(), None, "ticket 5 is not stored yet");
    out.close(1013, "bye");
    assert!(
        matches!(rx.next().await, Next::Close(c) if c.code == 1013),
        "a close overtakes held frames"
    );
}

#[tokio::test]
async fn without_a_gate_nothing_waits() {
    let (out, mut rx) = outbox(8, 100);
    out.push_sequenced(Message::Text("1".into()), None, (1, 9))
        .unwrap();
    assert_eq!(rx.try_frame().and_then(|f| f.seq), Some(1));
}

#[tokio::test]
async fn first_close_wins() {
    let (out, mut rx) = outbox(1, 10);
    assert!(out.close(1008, "a"));
    assert!(!out.close(1000, "b"));
    assert_eq!(
        rx.closed().await,
        CloseRequest {
            code: 1008,
            reason: "a".into()
        }
    );
}

#[tokio::test]
async fn a_held_reply_waits_for_its_mirror_write_and_carries_no_sequence_id() {
    let stored = Arc::new(watch::Sender::new(0));
    let (out, mut rx) = outbox(8, 100);
    rx.set_gate(gate(&stored));
    out.push_held(Message::Text("streamAck".into()), 2).unwrap();
    out.push(Message::Text("pong".into())).unwrap();
    assert_eq!(rx.try_frame(), None, "held until ticket 2 is stored");
    stored.send_replace(2);
    let first = rx.next().await;
    assert!(matches!(first, Next::Frame(f) if f.seq.is_none()));
    assert_eq!(
        rx.try_frame().map(|f| f.msg),
        Some(Message::Text("pong".into())),
        "what was queued behind it follows, in order"
    );
}
