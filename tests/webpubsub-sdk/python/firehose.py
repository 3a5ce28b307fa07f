"""A fast publisher and a reliable subscriber that keeps reading, no network fault:
20,000 messages to the official Python client (json.reliable, which acknowledges
once a second, so it always has thousands of messages unacknowledged) from an
unpaced publisher. Every message must arrive, in order, on the one connection: no
`disconnected` event, no new connection id.

The publisher speaks the JSON subprotocol itself, over websocket-client (what the SDK
is built on), with up to WINDOW sends in flight, each with its own ackId and every
ack checked: the SDK's own send waits for each ack on a condition variable it starts
waiting on only after sending, so on a fast server most acks are missed wake-ups and
each send stalls for its ack timeout (see harness.py), which no longer tests a fast
publisher.
"""

import json
import threading
import time

import websocket
from azure.messaging.webpubsubclient import WebPubSubClient
from azure.messaging.webpubsubclient.models import CallbackType
from azure.messaging.webpubsubservice import WebPubSubServiceClient

from harness import ACK_TIMEOUT, Statehub, close_all, scenario, until

TOTAL = 20000
WINDOW = 64


class Publisher:
    """sendToGroup on json.webpubsub.azure.v1 with up to `window` acks outstanding."""

    def __init__(self, url):
        self.ws = websocket.create_connection(url, subprotocols=["json.webpubsub.azure.v1"])
        connected = json.loads(self.ws.recv())
        assert connected.get("event") == "connected", connected
        self.acked = 0
        self.failed = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while True:
            try:
                msg = json.loads(self.ws.recv())
            except Exception:  # noqa: BLE001 - the socket closed
                return
            if msg.get("type") != "ack":
                continue
            with self.cv:
                if msg.get("success"):
                    self.acked += 1
                else:
                    self.failed.append(msg)
                self.cv.notify_all()

    def publish(self, group, total, window):
        """Publishes {"i": 1} to {"i": total}."""
        self.publish_range(group, 1, total, window)

    def publish_range(self, group, first, count, window):
        """Publishes {"i": first} to {"i": first + count - 1}, each with ackId i, and
        waits for every ack."""
        with self.cv:
            base = self.acked + len(self.failed)

        def answered():
            return self.acked + len(self.failed) - base

        for i in range(first, first + count):
            with self.cv:
                if not self.cv.wait_for(lambda: i - first - answered() < window, 30):
                    raise TimeoutError(f"no ack for 30 s at message {i} (acked {self.acked})")
            frame = {"type": "sendToGroup", "group": group, "dataType": "json", "data": {"i": i}, "ackId": i}
            self.ws.send(json.dumps(frame))
        with self.cv:
            if not self.cv.wait_for(lambda: answered() >= count, 30):
                raise TimeoutError(f"not every ack came (acked {self.acked})")

    def close(self):
        self.ws.close()


def body(t):
    server = Statehub()
    svc = WebPubSubServiceClient.from_connection_string(server.connection_string, hub="pyfirehose")
    clients = []
    publisher = None
    try:
        sub_token = svc.get_client_access_token(user_id="sub", groups=["g"])
        sub = WebPubSubClient(sub_token["url"], ack_timeout=ACK_TIMEOUT)
        clients.append(sub)
        got, connected, disconnected, lock = [], [], [], threading.Lock()

        def on_group(e):
            with lock:
                got.append(e.data["i"])

        sub.subscribe(CallbackType.GROUP_MESSAGE, on_group)
        sub.subscribe(CallbackType.CONNECTED, lambda e: connected.append(e.connection_id))
        sub.subscribe(CallbackType.DISCONNECTED, lambda e: disconnected.append(e.message))
        sub.open()
        until(5, "connected", lambda: len(connected) == 1)

        pub_token = svc.get_client_access_token(user_id="pub", roles=["webpubsub.sendToGroup"])
        publisher = Publisher(pub_token["url"])
        started = time.monotonic()
        publisher.publish("g", TOTAL, WINDOW)
        publish_seconds = time.monotonic() - started
        until(60, lambda: f"all {TOTAL} delivered (got {len(got)}, disconnected {disconnected})",
              lambda: len(got) >= TOTAL or disconnected)
        time.sleep(0.3)
        t.eq(publisher.acked, TOTAL, "every publish acknowledged")
        t.eq(publisher.failed, [], "no publish failed")
        t.eq(len(got), TOTAL, "every message delivered once")
        t.ok(got == list(range(1, TOTAL + 1)), "delivered in order")
        t.eq(disconnected, [], "no disconnected event")
        t.eq(len(connected), 1, "one connection id")
        t.eq(svc.connection_exists(connected[0]), True, "the session lives on")
        t.counts["messages"] = TOTAL
        t.counts["publishedPerSecond"] = round(TOTAL / publish_seconds)
        t.counts["seconds"] = round(time.monotonic() - started, 2)
    finally:
        if publisher:
            publisher.close()
        close_all(clients)
        server.stop()


if __name__ == "__main__":
    scenario("py-firehose", body)
