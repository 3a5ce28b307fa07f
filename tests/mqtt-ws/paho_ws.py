"""paho-mqtt's websockets transport against statehub's MQTT over WebSocket (run by
crates/statehub/tests/mqtt_ws_clients.rs, which starts statehub).

    python paho_ws.py HTTP_HOST:PORT MQTT_HOST:PORT [CA_FILE]

QoS 0/1/2 and a retained message over ws:// (over wss:// trusting CA_FILE if given)
(MQTT 5 and 3.1.1), a paho TCP client and
a paho WebSocket client exchanging messages, and a session taken over from TCP to
WebSocket. Prints `RESULT {"passed": n, "failed": [...]}` and exits 0 only if every
check passed.
"""

import json
import queue
import sys

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

WAIT = 30.0
HTTP = sys.argv[1].rsplit(":", 1)
TCP = sys.argv[2].rsplit(":", 1)
CA = sys.argv[3] if len(sys.argv) > 3 else None

passed = []
failed = []


def check(name, ok, detail=""):
    (passed if ok else failed).append(name if ok else f"{name} {detail}".strip())


class Client:
    """A paho client whose callbacks feed queues the checks wait on."""

    def __init__(self, client_id, transport, version, clean=True, expiry=None):
        protocol = mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311
        self.c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=protocol,
            transport=transport,
            # A connection taken over must stay gone, not take its session back.
            reconnect_on_failure=False,
            **({} if version == 5 else {"clean_session": clean}),
        )
        self.messages = queue.Queue()
        self.events = queue.Queue()
        self.c.on_connect = lambda c, u, flags, rc, p: self.events.put(("connack", flags, rc))
        self.c.on_disconnect = lambda c, u, flags, rc, p: self.events.put(("disconnect", rc))
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.events.put(("suback", mid))
        self.c.on_message = lambda c, u, m: self.messages.put(m)
        if transport == "websockets":
            self.c.ws_set_options(path="/mqtt")
            if CA is not None:
                self.c.tls_set(ca_certs=CA)
            host, port = HTTP
        else:
            host, port = TCP
        kwargs = {}
        if version == 5:
            props = Properties(PacketTypes.CONNECT)
            if expiry is not None:
                props.SessionExpiryInterval = expiry
            kwargs = {"clean_start": clean, "properties": props}
        self.c.connect(host, int(port), keepalive=60, **kwargs)
        self.c.loop_start()
        kind, self.flags, self.rc = self.event("connack")
        if self.rc.is_failure:
            raise RuntimeError(f"{client_id}: CONNACK {self.rc}")

    def event(self, kind):
        while True:
            got = self.events.get(timeout=WAIT)
            if got[0] == kind:
                return got

    def subscribe(self, topic, qos):
        self.c.subscribe(topic, qos)
        self.event("suback")

    def publish(self, topic, payload, qos, retain=False):
        self.c.publish(topic, payload, qos=qos, retain=retain).wait_for_publish(WAIT)

    def message(self, topic):
        while True:
            m = self.messages.get(timeout=WAIT)
            if m.topic == topic:
                return m

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


def basics(version):
    tag = f"v{version}"
    c = Client(f"paho-basics-{tag}", "websockets", version)
    c.subscribe(f"basics/{tag}/#", 2)
    for qos in (0, 1, 2):
        topic = f"basics/{tag}/q{qos}"
        c.publish(topic, f"qos {qos}", qos)
        m = c.message(topic)
        check(f"{tag} QoS {qos} round trip", m.payload == f"qos {qos}".encode() and m.qos == qos,
              f"{m.payload} qos {m.qos}")
    big = b"y" * (200 * 1024)
    c.publish(f"basics/{tag}/big", big, 1)
    check(f"{tag} 200 KiB payload", c.message(f"basics/{tag}/big").payload == big)
    c.publish(f"retained/{tag}", "kept", 1, retain=True)
    c.close()
    late = Client(f"paho-late-{tag}", "websockets", version)
    late.subscribe(f"retained/{tag}", 1)
    m = late.message(f"retained/{tag}")
    check(f"{tag} retained message", m.payload == b"kept" and m.retain, f"{m.payload} {m.retain}")
    late.close()


def cross_transport():
    ws = Client("paho-cross-ws", "websockets", 5)
    tcp = Client("paho-cross-tcp", "tcp", 5)
    ws.subscribe("cross/fromtcp", 1)
    tcp.subscribe("cross/fromws", 1)
    tcp.publish("cross/fromtcp", "hello ws", 1)
    check("TCP to WebSocket", ws.message("cross/fromtcp").payload == b"hello ws")
    ws.publish("cross/fromws", "hello tcp", 1)
    check("WebSocket to TCP", tcp.message("cross/fromws").payload == b"hello tcp")
    ws.close()
    tcp.close()


def takeover():
    tcp = Client("paho-moved", "tcp", 5, clean=False, expiry=300)
    tcp.subscribe("moved/#", 1)
    ws = Client("paho-moved", "websockets", 5, clean=False, expiry=300)
    check("session present after takeover", ws.flags.session_present, str(ws.flags))
    _, rc = tcp.event("disconnect")
    check("the TCP connection is told 0x8E", rc.value == 0x8E, str(rc))
    tcp.c.loop_stop()
    ws.publish("moved/x", "still subscribed", 1)
    check("the taken-over subscription delivers", ws.message("moved/x").payload == b"still subscribed")
    ws.close()


try:
    basics(5)
    basics(4)
    cross_transport()
    takeover()
except Exception as e:  # noqa: BLE001 - every failure is reported in RESULT
    failed.append(f"error: {e!r}")
print("RESULT " + json.dumps({"passed": len(passed), "failed": failed}), flush=True)
sys.exit(0 if not failed else 1)
