"""Messaging with the official Python SDKs, nothing changed but the connection
string: azure-messaging-webpubsubclient (json.reliable, its default) and
azure-messaging-webpubsubservice's REST client. Covers connect, join/leave, send to
group (text/json/binary, no_echo, from_user_id), duplicate ackIds, a Forbidden send,
send to all/user/connection with OData filters and excluded connections, group
membership by connection and by user, existence checks, permissions, listing group
members and closing a connection."""

import threading
import time

from azure.messaging.webpubsubclient import WebPubSubClient
from azure.messaging.webpubsubclient.models import (
    CallbackType,
    SendMessageError,
    WebPubSubDataType,
)
from azure.messaging.webpubsubservice import WebPubSubServiceClient

from harness import ACK_TIMEOUT, Statehub, close_all, scenario, until


def body(t):
    server = Statehub()
    svc = WebPubSubServiceClient.from_connection_string(server.connection_string, hub="pychat")
    clients = []

    def connect(user_id, roles=None, groups=None):
        token = svc.get_client_access_token(user_id=user_id, roles=roles or [], groups=groups)
        client = WebPubSubClient(token["url"], message_retry_total=1, ack_timeout=ACK_TIMEOUT)
        inbox, info, lock = [], {}, threading.Lock()

        def on_group(e):
            with lock:
                inbox.append(("group", e.group, e.data_type, e.data, e.from_user_id))

        def on_server(e):
            with lock:
                inbox.append(("server", None, e.data_type, e.data, None))

        client.subscribe(CallbackType.GROUP_MESSAGE, on_group)
        client.subscribe(CallbackType.SERVER_MESSAGE, on_server)
        client.subscribe(CallbackType.CONNECTED, lambda e: info.update(id=e.connection_id, user=e.user_id))
        client.open()
        clients.append(client)
        until(5, f"{user_id} connected", lambda: "id" in info)
        return client, inbox, info

    try:
        alice, a_in, a = connect("alice", ["webpubsub.joinLeaveGroup", "webpubsub.sendToGroup"])
        bob, b_in, b = connect("bob", ["webpubsub.joinLeaveGroup"], ["lobby"])
        carol, c_in, c = connect("carol", ["webpubsub.joinLeaveGroup"])
        t.eq(a["user"], "alice", "connected userId")
        t.ok(a["id"] != b["id"], "distinct connection ids")

        alice.join_group("lobby")
        carol.join_group("lobby")
        alice.send_to_group("lobby", "hello", WebPubSubDataType.TEXT)
        alice.send_to_group("lobby", {"n": 1}, WebPubSubDataType.JSON)
        alice.send_to_group("lobby", memoryview(b"\x01\x02\x03"), WebPubSubDataType.BINARY)
        until(5, "bob gets 3", lambda: len(b_in) >= 3)
        t.eq([m[2] for m in b_in[:3]], ["text", "json", "binary"], "data types in order")
        t.eq(b_in[0][3], "hello", "text payload")
        t.eq(b_in[1][3], {"n": 1}, "json payload")
        t.eq(bytes(b_in[2][3]), b"\x01\x02\x03", "binary payload")
        t.eq(b_in[0][4], "alice", "from_user_id")
        t.eq(b_in[0][1], "lobby", "group")

        until(5, "alice's echoes", lambda: len(a_in) >= 3)
        before = len(a_in)
        alice.send_to_group("lobby", "quiet", WebPubSubDataType.TEXT, no_echo=True)
        until(5, "carol gets quiet", lambda: any(m[3] == "quiet" for m in c_in))
        time.sleep(0.3)
        t.eq(len(a_in), before, "no_echo: no echo to the sender")

        carol.leave_group("lobby")
        alice.send_to_group("lobby", "after-leave", WebPubSubDataType.TEXT)
        until(5, "bob gets after-leave", lambda: any(m[3] == "after-leave" for m in b_in))
        time.sleep(0.2)
        t.ok(not any(m[3] == "after-leave" for m in c_in), "left group: no delivery")

        # The same ackId twice: the SDK takes the Duplicate ack as success; one delivery.
        alice.send_to_group("lobby", "once", WebPubSubDataType.TEXT, ack_id=9001)
        alice.send_to_group("lobby", "once", WebPubSubDataType.TEXT, ack_id=9001)
        alice.send_to_group("lobby", "marker", WebPubSubDataType.TEXT)
        until(5, "bob gets marker", lambda: any(m[3] == "marker" for m in b_in))
        t.eq(sum(1 for m in b_in if m[3] == "once"), 1, "duplicate ackId delivered once")

        forbidden = None
        try:
            bob.send_to_group("lobby", "nope", WebPubSubDataType.TEXT)
        except SendMessageError as e:
            forbidden = e
        t.eq(getattr(getattr(forbidden, "error_detail", None), "name", None), "Forbidden",
             "send without the role is Forbidden")

        svc.send_to_all({"to": "all-but-carol"}, filter="userId ne 'carol'")
        svc.send_to_all("all-but-bob", content_type="text/plain", excluded=[b["id"]])
        svc.send_to_user("carol", {"to": "carol"})
        svc.send_to_connection(b["id"], "to-bob-conn", content_type="text/plain")

        def server_data(inbox):
            return [m[3] for m in inbox if m[0] == "server"]

        until(5, "server messages", lambda: len(server_data(a_in)) >= 2 and len(server_data(b_in)) >= 2
              and len(server_data(c_in)) >= 2)
        time.sleep(0.2)
        t.eq(server_data(a_in), [{"to": "all-but-carol"}, "all-but-bob"], "alice's server messages")
        t.eq(server_data(b_in), [{"to": "all-but-carol"}, "to-bob-conn"], "bob's server messages")
        t.eq(server_data(c_in), ["all-but-bob", {"to": "carol"}], "carol's server messages")

        svc.add_connection_to_group("room", c["id"])
        svc.add_user_to_group("room", "bob")
        t.eq(svc.group_exists("room"), True, "group_exists(room)")
        t.eq(svc.group_exists("empty-room"), False, "group_exists(empty-room)")
        t.eq(svc.user_exists("bob"), True, "user_exists(bob)")
        t.eq(svc.user_exists("zed"), False, "user_exists(zed)")
        t.eq(svc.connection_exists(a["id"]), True, "connection_exists(alice)")
        t.eq(svc.connection_exists("nope"), False, "connection_exists(unknown)")
        members = sorted(m.connection_id for m in svc.list_connections(group="room"))
        t.eq(members, sorted([b["id"], c["id"]]), "list_connections(room)")
        svc.send_to_group("room", "room-1", content_type="text/plain", filter="userId eq 'bob'")
        svc.send_to_group("room", "room-2", content_type="text/plain")
        until(5, "room messages", lambda: sum(1 for m in b_in if m[1] == "room") >= 2
              and any(m[3] == "room-2" for m in c_in))
        t.eq([m[3] for m in c_in if m[1] == "room"], ["room-2"], "filtered group send")
        svc.remove_user_from_group("room", "bob")
        svc.remove_connection_from_group("room", c["id"])
        t.eq(svc.group_exists("room"), False, "room empty after removals")

        t.eq(svc.has_permission("sendToGroup", c["id"], target_name="lobby"), False, "no permission yet")
        svc.grant_permission("sendToGroup", c["id"], target_name="lobby")
        t.eq(svc.has_permission("sendToGroup", c["id"], target_name="lobby"), True, "granted")
        carol.send_to_group("lobby", "carol-can", WebPubSubDataType.TEXT)
        until(5, "bob gets carol-can", lambda: any(m[3] == "carol-can" for m in b_in))
        svc.revoke_permission("sendToGroup", c["id"], target_name="lobby")
        t.eq(svc.has_permission("sendToGroup", c["id"], target_name="lobby"), False, "revoked")

        gone = []
        carol.subscribe(CallbackType.DISCONNECTED, lambda e: gone.append(e.connection_id))
        svc.close_connection(c["id"], reason="bye")
        until(5, "carol disconnected", lambda: len(gone) >= 1)
        t.eq(gone[0], c["id"], "disconnected event connection id")
        t.counts["messagesChecked"] = len(a_in) + len(b_in) + len(c_in)
    finally:
        close_all(clients)
        server.stop()


scenario("py-messaging", body)
