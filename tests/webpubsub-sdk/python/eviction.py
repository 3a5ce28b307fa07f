"""The replay buffer's bound (16 KiB here, about 70 messages) with the official Python
client behind a proxy, as js/eviction.mjs: (1) 500 messages arrive on the live
connection although the buffer evicts, and once the client's sequenceAck covers them
a reset is recovered silently; (2) with the client's acks held back by the proxy, 500
more arrive and a reset then needs evicted messages: the recovery is accepted, told
`disconnected` (naming them) and closed with 1008; the client reports `disconnected`
and starts a new connection, which receives again. Nothing arrives twice or out of
order."""

import threading
import time

from azure.messaging.webpubsubclient import WebPubSubClient
from azure.messaging.webpubsubclient.models import CallbackType
from azure.messaging.webpubsubclient.models._models import SequenceAckMessage
from azure.messaging.webpubsubservice import WebPubSubServiceClient

from firehose import Publisher
from harness import ACK_TIMEOUT, Proxy, Statehub, close_all, scenario, until

BURST = 500


def body(t):
    server = Statehub("[webpubsub.limits]\nreplay_buffer_bytes = 16384\n")
    proxy = Proxy(server.port)
    svc = WebPubSubServiceClient.from_connection_string(server.connection_string, hub="pyeviction")
    clients = []
    publisher = None
    try:
        sub_token = svc.get_client_access_token(
            user_id="sub", groups=["g"], roles=["webpubsub.joinLeaveGroup"])
        sub = WebPubSubClient(proxy.url(sub_token["url"]), reconnect_retry_total=30,
                              reconnect_retry_backoff_factor=0.2, ack_timeout=ACK_TIMEOUT)
        clients.append(sub)
        got, connected, disconnected, acks, lock = [], [], [], [], threading.Lock()

        def on_group(e):
            with lock:
                got.append(e.data["i"])

        sub.subscribe(CallbackType.GROUP_MESSAGE, on_group)
        sub.subscribe(CallbackType.CONNECTED, lambda e: connected.append(e.connection_id))
        sub.subscribe(CallbackType.DISCONNECTED, lambda e: disconnected.append(e.message))
        # Watch the client's sequenceAcks go out (the SDK has no event for them).
        send_message = sub._send_message

        def watched(message, **kwargs):
            send_message(message, **kwargs)
            if isinstance(message, SequenceAckMessage):
                acks.append(message.sequence_id)

        sub._send_message = watched
        sub.open()
        until(5, "connected", lambda: len(connected) == 1)

        pub_token = svc.get_client_access_token(user_id="pub", roles=["webpubsub.sendToGroup"])
        publisher = Publisher(pub_token["url"])
        sent = {"n": 0}

        def publish(n):
            publisher.publish_range("g", sent["n"] + 1, n, 16)
            sent["n"] += n

        # 1. Evictions on a live connection; a recovery the client's ack covers.
        publish(BURST)
        until(20, lambda: f"{BURST} delivered (got {len(got)})", lambda: len(got) >= BURST)
        t.eq(disconnected, [], "evicting never closed the live connection")
        until(10, "a sequenceAck covering every message", lambda: any(a >= BURST for a in acks))
        sub.join_group("sync")  # acknowledged: the server has processed the sequenceAck
        proxy.drop_all()
        publish(10)
        until(20, lambda: f"recovered (got {len(got)})", lambda: len(got) >= BURST + 10)
        t.eq(disconnected, [], "recovered: the ack covered every evicted message")
        t.eq(len(connected), 1, "same connection")

        # 2. Acks held back, so the recovery needs evicted messages.
        proxy.holding = True
        publish(BURST)
        until(20, lambda: f"{2 * BURST + 10} delivered (got {len(got)})",
              lambda: len(got) >= 2 * BURST + 10)
        proxy.drop_all()
        proxy.holding = False
        until(20, "disconnected after the failed recovery", lambda: len(disconnected) == 1)
        t.ok("cannot be recovered" in (disconnected[0] or ""),
             f"the disconnected message says why ({disconnected[0]!r})")
        until(20, "a new connection", lambda: len(connected) == 2)
        t.ok(connected[1] != connected[0], "a new connection id")
        before = len(got)

        def again():
            publish(1)
            time.sleep(0.1)
            return len(got) > before

        until(10, "messages again on the new connection", again)
        t.ok(all(b > a for a, b in zip(got, got[1:])), "nothing twice or out of order")
        t.ok(got[: 2 * BURST + 10] == list(range(1, 2 * BURST + 11)),
             "everything delivered before the reset")
        t.counts["delivered"] = len(got)
        t.counts["disconnectedMessage"] = disconnected[0]
    finally:
        if publisher:
            publisher.close()
        close_all(clients)
        proxy.close()
        server.stop()


if __name__ == "__main__":
    scenario("py-eviction", body)
