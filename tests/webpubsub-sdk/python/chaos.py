"""Chaos with the official Python client: the subscriber (json.reliable) goes through a
proxy that resets its connection every 300 ms while an unpaced publisher sends 10,000
messages to its group. The client recovers its session after each reset; every
message must reach the application exactly once and in order, with no `disconnected`
event and no new connection id.

The publisher is firehose.py's (the JSON subprotocol over websocket-client, up to 64
sends in flight, every ack checked), connected directly: the JS chaos scenario covers
a publisher whose own connection is reset.
"""

import threading
import time

from azure.messaging.webpubsubclient import WebPubSubClient
from azure.messaging.webpubsubclient.models import CallbackType
from azure.messaging.webpubsubservice import WebPubSubServiceClient

from firehose import Publisher
from harness import ACK_TIMEOUT, Proxy, Statehub, close_all, scenario, until

TOTAL = 10000
RESET_EVERY = 0.3


def body(t):
    server = Statehub()
    proxy = Proxy(server.port)
    svc = WebPubSubServiceClient.from_connection_string(server.connection_string, hub="pychaos")
    clients = []
    publisher = None
    stop = threading.Event()
    try:
        sub_token = svc.get_client_access_token(user_id="sub", groups=["g"])
        sub = WebPubSubClient(proxy.url(sub_token["url"]), ack_timeout=ACK_TIMEOUT)
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

        def chaos():
            while not stop.wait(RESET_EVERY):
                proxy.drop_all()

        threading.Thread(target=chaos, daemon=True).start()
        pub_token = svc.get_client_access_token(user_id="pub", roles=["webpubsub.sendToGroup"])
        publisher = Publisher(pub_token["url"])
        started = time.monotonic()
        publisher.publish("g", TOTAL, 64)
        publish_seconds = time.monotonic() - started
        until(60, lambda: f"all {TOTAL} delivered (got {len(got)}, last {got[-1:]}, "
              f"disconnected {disconnected}, drops {proxy.drops})",
              lambda: (got and got[-1] >= TOTAL) or disconnected)
        stop.set()
        time.sleep(0.3)
        t.eq(publisher.acked, TOTAL, "every publish acknowledged")
        t.eq(len(got), TOTAL, "every message delivered once")
        t.ok(got == list(range(1, TOTAL + 1)), "in order, no gaps or repeats")
        t.eq(disconnected, [], "no disconnected event")
        t.eq(len(connected), 1, "one connection id")
        t.ok(proxy.drops >= 5, f"the proxy reset the connection ({proxy.drops} times)")
        t.counts["messages"] = TOTAL
        t.counts["publishedPerSecond"] = round(TOTAL / publish_seconds)
        t.counts["proxyDrops"] = proxy.drops
        t.counts["seconds"] = round(time.monotonic() - started, 2)
    finally:
        stop.set()
        if publisher:
            publisher.close()
        close_all(clients)
        proxy.close()
        server.stop()


if __name__ == "__main__":
    scenario("py-chaos", body)
