"""A reliable session recovered on another node with the official Python client: two
statehub nodes on one redis-server, the subscriber reaching node A through a proxy;
node A is killed (SIGKILL) and the proxy sends the client's recovery to node B, which
takes the session over: the same connection, no `disconnected`, every message sent by
a publisher on B before, during and after the move exactly once and in order."""

import socket
import subprocess
import time

from azure.messaging.webpubsubclient import WebPubSubClient
from azure.messaging.webpubsubservice import WebPubSubServiceClient

from harness import (ACK_TIMEOUT, Proxy, Statehub, close_all, numbered_publisher, scenario,
                     until, watch)


def free_port():
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def start_redis():
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def accepting():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    until(15, "redis-server accepts connections", accepting)
    return proc, f"redis://127.0.0.1:{port}"


def body(t):
    redis, url = start_redis()

    def config(node):
        return (f'[cluster]\nredis_url = "{url}"\nnode_id = "{node}"\n'
                f'namespace = "pyr{redis.pid}"\n')

    nodes, clients, proxy = [], [], None
    try:
        a = Statehub(config("a"))
        nodes.append(a)
        b = Statehub(config("b"))
        nodes.append(b)
        proxy = Proxy(a.port)
        svc = WebPubSubServiceClient.from_connection_string(b.connection_string, hub="pyrecover")
        sub_token = svc.get_client_access_token(user_id="sub", groups=["g"])
        sub = WebPubSubClient(proxy.url(sub_token["url"]), reconnect_retry_backoff_factor=0.2,
                              reconnect_retry_backoff_max=1.0, reconnect_retry_total=30,
                              ack_timeout=ACK_TIMEOUT)
        clients.append(sub)
        got, connected, disconnected = watch(sub, lambda e: e.message)
        sub.open()
        until(10, "connected", lambda: len(connected) == 1)

        _, publish = numbered_publisher(svc, clients)
        publish(30)
        until(10, "30 before the kill", lambda: len(got) >= 30)
        proxy.target = b.port
        a.stop()
        nodes.remove(a)
        proxy.drop_all()
        publish(60)
        until(30, lambda: f"90 after recovery on B (got {len(got)}, connected {connected}, "
              f"disconnected {disconnected})", lambda: len(got) >= 90)
        time.sleep(0.3)
        t.eq(got, list(range(1, 91)), "every message once, in order, across the move")
        t.eq(disconnected, [], "recovered on B without a disconnected event")
        t.eq(len(connected), 1, "no new connection")
        t.eq(svc.connection_exists(connected[0]), True, "the session lives on B")
        t.counts = {"delivered": len(got)}
    finally:
        close_all(clients)
        if proxy:
            proxy.close()
        for n in nodes:
            n.stop()
        redis.kill()
        redis.wait()


scenario("cluster_recovery", body)
