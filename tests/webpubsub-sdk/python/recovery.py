"""Connection recovery with the official Python client behind a fault-injecting
proxy: (1) the TCP connection is reset while messages flow and the client recovers
the same session, getting every message exactly once and in order; (2) the proxy
refuses connections until the session's retention (2 s here) has passed, so the
recovery attempt is accepted and closed with 1008, the client reports
`disconnected`, opens a new connection and rejoins its group."""

import time

from azure.messaging.webpubsubclient import WebPubSubClient
from azure.messaging.webpubsubclient.models import CallbackType, WebPubSubDataType

from harness import ACK_TIMEOUT, numbered_publisher, running, scenario, until, watch

CONFIG = "[webpubsub.limits]\nsession_retention_secs = 2\n"


def body(t):
    with running("pyrecovery", CONFIG, proxied=True) as (_, proxy, svc, clients):
        sub_token = svc.get_client_access_token(user_id="sub", roles=["webpubsub.joinLeaveGroup"])
        # Reconnect attempts made while the proxy refuses count against the SDK's
        # reconnect budget (3 by default): allow enough to outlast the 2 s refusal.
        sub = WebPubSubClient(proxy.url(sub_token["url"]), reconnect_retry_backoff_factor=0.2,
                              reconnect_retry_backoff_max=1.0, reconnect_retry_total=30,
                              ack_timeout=ACK_TIMEOUT)
        clients.append(sub)
        got, connected, disconnected = watch(sub, lambda e: e.connection_id)
        sub.open()
        sub.join_group("g")
        until(5, "connected", lambda: len(connected) == 1)
        first = connected[0]

        pub, publish = numbered_publisher(svc, clients)
        publish(30)
        until(5, "30 before the drop", lambda: len(got) >= 30)
        proxy.drop_all()
        publish(60)
        until(20, lambda: f"90 after recovery (got {len(got)}, connected {connected}, "
              f"disconnected {disconnected}, drops {proxy.drops})", lambda: len(got) >= 90)
        time.sleep(0.3)
        t.eq(len(got), 90, "every message once")
        t.eq(got, list(range(1, 91)), "in order, no gaps or repeats")
        t.eq(disconnected, [], "recovered without a disconnected event")
        t.eq(len(connected), 1, "no new connection")
        t.eq(svc.connection_exists(first), True, "the session lives on")
        t.ok(proxy.drops >= 1, "the proxy dropped the connection")

        proxy.refusing = True
        proxy.drop_all()
        until(10, "the session to expire", lambda: not svc.connection_exists(first))
        publish(5)
        proxy.refusing = False
        until(40, "a new connection", lambda: len(connected) == 2)
        t.eq(len(disconnected), 1, "one disconnected event after the failed recovery")
        t.ok(connected[1] != first, "a new connection id")
        before = len(got)

        def rejoined():
            pub.send_to_group("g", {"i": -1}, WebPubSubDataType.JSON)
            time.sleep(0.1)
            return len(got) > before

        until(10, "group rejoined", rejoined)
        t.ok(all(v == -1 for v in got[before:]), "only messages published after the rejoin")
        t.counts["delivered"] = len(got)
        t.counts["proxyDrops"] = proxy.drops


scenario("py-recovery", body)
