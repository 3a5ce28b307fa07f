"""Shared pieces of the Python SDK scenarios: start a statehub on free ports, a
fault-injecting TCP proxy, and a check collector that prints `RESULT <json>`.

Each scenario is its own script so the Rust launcher
(crates/statehub/tests/webpubsub_sdk.rs) runs them in parallel; a scenario exits 0
only when every check passed.
"""

import contextlib
import faulthandler
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from urllib.parse import urlsplit, urlunsplit

ACCESS_KEY = "statehub-sdk-test-key-0123456789abcdef"
_SERVERS = []

# azure-messaging-webpubsubclient 1.1.0 waits for an ack on a condition variable it
# only starts waiting on after the send returns: an ack that arrives first is a lost
# wake-up, and the send then stalls for the whole ack timeout (30 s by default)
# before it succeeds. The scenarios use a short timeout so such a stall costs 1 s; a
# genuinely late ack makes the SDK retry with the same ackId, which statehub answers
# as a Duplicate (success) without publishing twice.
ACK_TIMEOUT = 1.0


class Statehub:
    """`statehub serve` on 127.0.0.1:0 with one access key and an optional config."""

    def __init__(self, config_toml=""):
        binary = os.environ.get("STATEHUB_BIN")
        if not binary:
            raise RuntimeError("STATEHUB_BIN is not set (the Rust launcher sets it)")
        self._dir = tempfile.TemporaryDirectory(prefix="statehub-sdk-")
        config = os.path.join(self._dir.name, "statehub.toml")
        with open(config, "w", encoding="utf-8") as f:
            f.write(config_toml)
        env = dict(os.environ, RUST_LOG="info", NO_COLOR="1")
        self.proc = subprocess.Popen(
            [binary, "serve", "--mqtt-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
             "--config", config, "--access-key", ACCESS_KEY],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=env, text=True)
        self.log = []
        _SERVERS.append(self)
        found = threading.Event()
        self.port = None

        def read():
            for line in self.proc.stderr:
                self.log.append(line.rstrip())
                m = re.search(r"http listening on \S+:(\d+)", line)
                if m and not found.is_set():
                    self.port = int(m.group(1))
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(15):
            self.stop()
            raise RuntimeError("statehub did not start:\n" + "\n".join(self.log))
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.connection_string = f"Endpoint={self.endpoint};AccessKey={ACCESS_KEY};Version=1.0;"

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self._dir.cleanup()


class Proxy:
    """A TCP proxy to 127.0.0.1:target that can reset every connection it carries, and
    hold what clients send (`holding = True`: the server's side still flows)."""

    def __init__(self, target):
        self.target = target
        self.refusing = False
        self.holding = False
        self.drops = 0
        self._pairs = set()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, url):
        parts = urlsplit(url)
        return urlunsplit(parts._replace(netloc=f"127.0.0.1:{self.port}"))

    def _accept(self):
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.refusing:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                _reset(client)
                continue
            pair = (client, upstream)
            with self._lock:
                self._pairs.add(pair)
            threading.Thread(target=self._pump, args=(client, upstream, pair, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, pair), daemon=True).start()

    def _pump(self, src, dst, pair, from_client=False):
        try:
            while True:
                while from_client and self.holding:
                    with self._lock:
                        if pair not in self._pairs:
                            return
                    time.sleep(0.01)
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._pairs.discard(pair)
        for s in pair:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def drop_all(self):
        with self._lock:
            pairs = list(self._pairs)
            self._pairs.clear()
        for pair in pairs:
            self.drops += 1
            for s in pair:
                _reset(s)

    def close(self):
        self._closed = True
        self.drop_all()
        self._server.close()


def _reset(sock):
    """Closes abortively (linger 0: RST), as a broken network path looks to the peer.

    The shutdown comes first because a close() alone does not wake a thread blocked
    in recv() on the same socket, and the kernel keeps the socket open until it does.
    """
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def close_all(clients):
    """Closes SDK clients on the way out of a scenario, whatever state they are in."""
    for client in clients:
        try:
            client.close()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


@contextlib.contextmanager
def running(hub, config_toml="", proxied=False):
    """A scenario's statehub (with `config_toml`), a `Proxy` in front of it if `proxied`
    (else None), a service client for `hub` and a list of what to close on the way out
    (SDK clients, publishers): yields (server, proxy, svc, clients), then closes them,
    the proxy and the server, whatever happened."""
    from azure.messaging.webpubsubservice import WebPubSubServiceClient

    server = Statehub(config_toml)
    proxy = Proxy(server.port) if proxied else None
    clients = []
    try:
        svc = WebPubSubServiceClient.from_connection_string(server.connection_string, hub=hub)
        yield server, proxy, svc, clients
    finally:
        close_all(clients)
        if proxy:
            proxy.close()
        server.stop()


def watch(client, on_disconnected=lambda e: e.message):
    """Records what `client` reports, in arrival order: each group message's `i`, each
    connection id, and `on_disconnected` of each disconnect. Returns the three lists."""
    from azure.messaging.webpubsubclient.models import CallbackType

    got, connected, disconnected, lock = [], [], [], threading.Lock()

    def on_group(e):
        with lock:
            got.append(e.data["i"])

    client.subscribe(CallbackType.GROUP_MESSAGE, on_group)
    client.subscribe(CallbackType.CONNECTED, lambda e: connected.append(e.connection_id))
    client.subscribe(CallbackType.DISCONNECTED,
                     lambda e: disconnected.append(on_disconnected(e)))
    return got, connected, disconnected


def numbered_publisher(svc, clients):
    """A client allowed to send to groups, opened and added to `clients`. Returns it
    and publish(n), which sends the next n numbered JSON messages ({"i": 1},
    {"i": 2}, ...) to group "g", each awaiting its ack."""
    from azure.messaging.webpubsubclient import WebPubSubClient
    from azure.messaging.webpubsubclient.models import WebPubSubDataType

    token = svc.get_client_access_token(user_id="pub", roles=["webpubsub.sendToGroup"])
    pub = WebPubSubClient(token["url"], ack_timeout=ACK_TIMEOUT)
    clients.append(pub)
    pub.open()
    counter = {"next": 1}

    def publish(n):
        for _ in range(n):
            pub.send_to_group("g", {"i": counter["next"]}, WebPubSubDataType.JSON)
            counter["next"] += 1

    return pub, publish


def until(seconds, what, cond):
    """Polls cond every 20 ms; `what` may be a callable giving the state on failure."""
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            what = what() if callable(what) else what
            raise TimeoutError(f"timed out after {seconds} s waiting for: {what}")
        time.sleep(0.02)


class Checks:
    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failed = []
        self.counts = {}

    def ok(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed.append(what)
            print(f"FAIL {self.name}: {what}", file=sys.stderr)

    def eq(self, actual, expected, what):
        self.ok(actual == expected, f"{what}: expected {expected!r}, got {actual!r}")


def scenario(name, body):
    """Runs body(checks); a raise is a failure; prints RESULT and exits."""
    checks = Checks(name)

    def watchdog():
        checks.ok(False, "scenario watchdog (100 s) fired; thread stacks on stderr")
        faulthandler.dump_traceback(file=sys.stderr)
        finish(checks, name)

    timer = threading.Timer(float(os.environ.get("SCENARIO_TIMEOUT_S", "100")), watchdog)
    timer.daemon = True
    timer.start()
    try:
        body(checks)
    except Exception:  # noqa: BLE001 - any failure of the scenario is reported
        checks.ok(False, "raised: " + traceback.format_exc())
    finish(checks, name)


def finish(checks, name):
    if checks.failed:
        for server in _SERVERS:
            print("--- statehub log\n" + "\n".join(server.log[-200:]), file=sys.stderr)
    result = dict(scenario=name, passed=checks.passed, failed=checks.failed, **checks.counts)
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0 if not checks.failed and checks.passed > 0 else 1)
