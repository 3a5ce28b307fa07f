"""paho-mqtt (MQTT 5) with a persistent session across statehub nodes, for
crates/statehub/tests/cluster_sessions.rs.

    paho_session.py PORT subscribe          subscribe `p/#` at QoS 1, then disconnect
    paho_session.py PORT resume COUNT       reconnect, print `PRESENT <0|1>`, then
                                            `MSG <payload>` for COUNT messages

Both connect as client id `paho-roamer` without Clean Start, Session Expiry 300 s.
"""
import sys
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

port, phase = int(sys.argv[1]), sys.argv[2]
count = int(sys.argv[3]) if phase == "resume" else 0
client = mqtt.Client(
    mqtt.CallbackAPIVersion.VERSION2,
    client_id="paho-roamer",
    protocol=mqtt.MQTTv5,
)
done = threading.Event()
got = []


def on_connect(client, userdata, flags, reason_code, properties):
    if reason_code.is_failure:
        print(f"CONNACK {reason_code.value}", flush=True)
        done.set()
        return
    if phase == "subscribe":
        client.subscribe("p/#", qos=1)
    else:
        print(f"PRESENT {int(flags.session_present)}", flush=True)
        if count == 0:
            done.set()


def on_subscribe(client, userdata, mid, reason_codes, properties):
    done.set()


def on_message(client, userdata, message):
    got.append(message.payload.decode())
    print(f"MSG {message.payload.decode()}", flush=True)
    if len(got) >= count:
        done.set()


client.on_connect = on_connect
client.on_subscribe = on_subscribe
client.on_message = on_message
props = Properties(PacketTypes.CONNECT)
props.SessionExpiryInterval = 300
client.connect("127.0.0.1", port, clean_start=False, properties=props)
client.loop_start()
ok = done.wait(15)
client.disconnect()
client.loop_stop()
sys.exit(0 if ok else 1)
