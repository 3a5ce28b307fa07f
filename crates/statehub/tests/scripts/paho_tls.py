"""paho-mqtt over TLS against statehub, for crates/statehub/tests/security.rs.

    paho_tls.py PORT CA_FILE MODE SECRET

MODE is `sat` (MQTT 5 enhanced authentication: method K8S-SAT, SECRET the token as
Authentication Data) or `password` (MQTT 3.1.1, user "robot", SECRET the password).
Prints `CONNACK <code>` (the reason code; paho maps a 3.1.1 return code to it); once
accepted, also publishes to and receives from `paho/tls` and prints `ECHO <payload>`.
"""
import sys
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

port, ca, mode, secret = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
v5 = mode == "sat"
client = mqtt.Client(
    mqtt.CallbackAPIVersion.VERSION2,
    client_id=f"paho-tls-{mode}",
    protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
)
client.tls_set(ca_certs=ca)
connack = threading.Event()
echo = threading.Event()
state = {}


def on_connect(client, userdata, flags, reason_code, properties):
    # paho reports a 3.1.1 return code as the matching MQTT 5 reason code.
    state["code"] = reason_code.value
    connack.set()
    if not reason_code.is_failure:
        client.subscribe("paho/tls", qos=1)


def on_subscribe(client, userdata, mid, reason_codes, properties):
    client.publish("paho/tls", b"over tls", qos=1)


def on_message(client, userdata, message):
    state["echo"] = message.payload.decode()
    echo.set()


client.on_connect = on_connect
client.on_subscribe = on_subscribe
client.on_message = on_message
properties = None
if v5:
    properties = Properties(PacketTypes.CONNECT)
    properties.AuthenticationMethod = "K8S-SAT"
    properties.AuthenticationData = secret.encode()
else:
    client.username_pw_set("robot", secret)
client.connect("localhost", port, keepalive=30, properties=properties)
client.loop_start()
if not connack.wait(15):
    print("NO CONNACK", flush=True)
    sys.exit(1)
print(f"CONNACK {state['code']}", flush=True)
if state["code"] == 0:
    if not echo.wait(15):
        print("NO ECHO", flush=True)
        sys.exit(1)
    print(f"ECHO {state['echo']}", flush=True)
client.loop_stop()
client.disconnect()
