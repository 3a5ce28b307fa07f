# paho-mqtt 2.x helper for external_clients.rs.
# usage: paho_client.py HOST PORT VERSION(5|3) TOPIC (sub|pub)
# sub: subscribes QoS 1, prints {"subscribed":...} once subscribed, then one JSON line
#      with the first message and its properties. pub: publishes one QoS 1 message
#      with properties (v5) and prints the PUBACK outcome. Exits 3 on timeout (8 s).
import sys, json, time, threading
import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.packettypes import PacketTypes

host, port, version, topic, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
proto = mqtt.MQTTv5 if version == "5" else mqtt.MQTTv311
done = threading.Event()
out = {}

def on_connect(c, u, flags, rc, props=None):
    out["connack"] = str(rc)
    if mode == "sub":
        c.subscribe(topic, qos=1)
    else:
        p = None
        if proto == mqtt.MQTTv5:
            p = Properties(PacketTypes.PUBLISH)
            p.UserProperty = [("k", "1"), ("a", "x"), ("k", "2")]
            p.ContentType = "application/json"
            p.ResponseTopic = "reply/py"
            p.CorrelationData = b"\x00\x01corr"
            p.MessageExpiryInterval = 60
            p.PayloadFormatIndicator = 1
        info = c.publish(topic, b'{"from":"paho"}', qos=1, properties=p)

def on_subscribe(c, u, mid, rcs, props=None):
    print(json.dumps({"subscribed": [str(r) for r in rcs]}), flush=True)

def on_publish(c, u, mid, rc, props=None):
    out["puback"] = str(rc)
    done.set()

def on_message(c, u, m):
    d = {"topic": m.topic, "payload": m.payload.decode(), "qos": m.qos}
    if proto == mqtt.MQTTv5 and hasattr(m, "properties") and m.properties is not None:
        pr = m.properties
        d["user"] = [list(x) for x in getattr(pr, "UserProperty", [])]
        d["content_type"] = getattr(pr, "ContentType", None)
        d["response_topic"] = getattr(pr, "ResponseTopic", None)
        cd = getattr(pr, "CorrelationData", None)
        d["correlation"] = cd.hex() if cd is not None else None
        d["expiry"] = getattr(pr, "MessageExpiryInterval", None)
        d["pfi"] = getattr(pr, "PayloadFormatIndicator", None)
    out["message"] = d
    done.set()

c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="py-" + mode + version, protocol=proto)
c.on_connect = on_connect; c.on_subscribe = on_subscribe; c.on_message = on_message; c.on_publish = on_publish
c.connect(host, port, keepalive=30)
c.loop_start()
ok = done.wait(8)
c.disconnect(); c.loop_stop()
print(json.dumps(out), flush=True)
sys.exit(0 if ok else 3)
