// Messaging with the official SDKs, nothing changed but the connection string:
// @azure/web-pubsub-client over json.reliable (its default) and @azure/web-pubsub's
// REST client. Covers connect, join/leave, send to group (text/json/binary, noEcho,
// fromUserId), send to all/user/connection with OData filters and excluded
// connections, group membership by connection and by user, existence checks,
// permissions, listing group members, closing connections and duplicate ackIds.

import { WebPubSubClient } from "@azure/web-pubsub-client";
import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { deferred, scenario, sleep, startStatehub, until, within } from "./lib.mjs";

scenario("messaging", async (t) => {
  const server = await startStatehub();
  const hub = "chat";
  const svc = new WebPubSubServiceClient(server.connectionString, hub, { allowInsecureConnection: true });
  const clients = [];
  const connect = async (userId, roles = [], groups = undefined) => {
    const token = await svc.getClientAccessToken({ userId, roles, groups });
    const client = new WebPubSubClient(token.url);
    const inbox = [];
    client.on("group-message", (e) => inbox.push({ ...e.message, kind: "group" }));
    client.on("server-message", (e) => inbox.push({ ...e.message, kind: "server" }));
    const connected = deferred();
    client.on("connected", (e) => connected.resolve(e));
    clients.push(client);
    await client.start();
    const info = await within(5000, `${userId} connected event`, connected.promise);
    return { client, inbox, info };
  };
  try {
    const alice = await connect("alice", ["webpubsub.joinLeaveGroup", "webpubsub.sendToGroup"]);
    const bob = await connect("bob", ["webpubsub.joinLeaveGroup"], ["lobby"]);
    const carol = await connect("carol", ["webpubsub.joinLeaveGroup"]);
    t.eq(alice.info.userId, "alice", "connected event userId");
    t.ok(/^\S{8,}$/.test(alice.info.connectionId), "connected event has a connectionId");
    t.ok(alice.info.connectionId !== bob.info.connectionId, "distinct connection ids");

    // Initial group from the token, join/leave, and group sends in three data types.
    await alice.client.joinGroup("lobby");
    await carol.client.joinGroup("lobby");
    await alice.client.sendToGroup("lobby", "hello", "text");
    await alice.client.sendToGroup("lobby", { n: 1, s: "x" }, "json");
    await alice.client.sendToGroup("lobby", new Uint8Array([1, 2, 3]).buffer, "binary");
    await until(5000, "bob gets 3 group messages", () => bob.inbox.length >= 3);
    t.eq(bob.inbox.map((m) => m.dataType), ["text", "json", "binary"], "bob's data types in order");
    t.eq(bob.inbox[0].data, "hello", "text payload");
    t.eq(bob.inbox[1].data, { n: 1, s: "x" }, "json payload");
    t.eq([...new Uint8Array(bob.inbox[2].data)], [1, 2, 3], "binary payload");
    t.eq(bob.inbox[0].fromUserId, "alice", "fromUserId");
    t.eq(bob.inbox[0].group, "lobby", "group name");
    await until(5000, "alice gets her own echo", () => alice.inbox.length >= 3);

    // noEcho: carol and bob get it, alice does not.
    const aliceBefore = alice.inbox.length;
    await alice.client.sendToGroup("lobby", "quiet", "text", { noEcho: true });
    await until(5000, "carol gets the noEcho message", () => carol.inbox.some((m) => m.data === "quiet"));
    await sleep(300);
    t.eq(alice.inbox.length, aliceBefore, "noEcho: sender got no echo");

    // Leave: carol no longer receives.
    await carol.client.leaveGroup("lobby");
    await alice.client.sendToGroup("lobby", "after-leave", "text");
    await until(5000, "bob gets after-leave", () => bob.inbox.some((m) => m.data === "after-leave"));
    await sleep(200);
    t.ok(!carol.inbox.some((m) => m.data === "after-leave"), "left group: no delivery");

    // Duplicate ackId: the second send is acked as a duplicate and not delivered.
    const first = await alice.client.sendToGroup("lobby", "once", "text", { ackId: 4242 });
    const second = await alice.client.sendToGroup("lobby", "once", "text", { ackId: 4242 });
    t.eq(first.isDuplicated, false, "first send with ackId 4242");
    t.eq(second.isDuplicated, true, "second send with ackId 4242 is Duplicate");
    await alice.client.sendToGroup("lobby", "marker", "text");
    await until(5000, "bob gets marker", () => bob.inbox.some((m) => m.data === "marker"));
    t.eq(bob.inbox.filter((m) => m.data === "once").length, 1, "duplicate delivered once");

    // Permission denied: bob has no sendToGroup role.
    let denied = null;
    try {
      await bob.client.sendToGroup("lobby", "nope", "text"); // the SDK retries 3 times, then throws
    } catch (err) {
      denied = err;
    }
    t.eq(denied?.errorDetail?.name, "Forbidden", "send without the role is Forbidden");

    // REST: send to all with a filter and an excluded connection.
    await svc.sendToAll({ to: "all-but-carol" }, { filter: "userId ne 'carol'" });
    await svc.sendToAll("all-but-bob", { contentType: "text/plain", excludedConnections: [bob.info.connectionId] });
    await svc.sendToUser("carol", { to: "carol" });
    await svc.sendToConnection(bob.info.connectionId, "to-bob-conn", { contentType: "text/plain" });
    await until(5000, "server messages", () =>
      alice.inbox.filter((m) => m.kind === "server").length >= 2 &&
      carol.inbox.filter((m) => m.kind === "server").length >= 2 &&
      bob.inbox.filter((m) => m.kind === "server").length >= 2);
    await sleep(200);
    const serverData = (c) => c.inbox.filter((m) => m.kind === "server").map((m) => m.data);
    t.eq(serverData(alice), [{ to: "all-but-carol" }, "all-but-bob"], "alice's server messages");
    t.eq(serverData(bob), [{ to: "all-but-carol" }, "to-bob-conn"], "bob's server messages");
    t.eq(serverData(carol), ["all-but-bob", { to: "carol" }], "carol's server messages");

    // REST group management by connection and by user, group sends with a filter.
    const room = svc.group("room");
    await room.addConnection(carol.info.connectionId);
    await room.addUser("bob");
    t.eq(await svc.groupExists("room"), true, "groupExists(room)");
    t.eq(await svc.groupExists("nobody-here"), false, "groupExists(nobody-here)");
    t.eq(await svc.userExists("bob"), true, "userExists(bob)");
    t.eq(await svc.userExists("zed"), false, "userExists(zed)");
    t.eq(await svc.connectionExists(alice.info.connectionId), true, "connectionExists(alice)");
    t.eq(await svc.connectionExists("no-such-connection"), false, "connectionExists(unknown)");
    const members = [];
    for await (const m of await room.listConnections()) members.push(m);
    t.eq(members.map((m) => m.connectionId).sort(), [bob.info.connectionId, carol.info.connectionId].sort(),
      "listConnections(room)");
    await room.sendToAll("room-1", { contentType: "text/plain", filter: "userId eq 'bob'" });
    await room.sendToAll("room-2", { contentType: "text/plain" });
    await until(5000, "room messages", () =>
      bob.inbox.filter((m) => m.group === "room").length >= 2 && carol.inbox.some((m) => m.data === "room-2"));
    t.eq(carol.inbox.filter((m) => m.group === "room").map((m) => m.data), ["room-2"], "filtered group send");
    await room.removeUser("bob");
    await room.removeConnection(carol.info.connectionId);
    t.eq(await svc.groupExists("room"), false, "room empty after removals");

    // Permissions granted and revoked on a connection.
    t.eq(await svc.hasPermission(carol.info.connectionId, "sendToGroup", { targetName: "lobby" }), false,
      "carol cannot send to lobby");
    await svc.grantPermission(carol.info.connectionId, "sendToGroup", { targetName: "lobby" });
    t.eq(await svc.hasPermission(carol.info.connectionId, "sendToGroup", { targetName: "lobby" }), true,
      "granted");
    await carol.client.sendToGroup("lobby", "carol-can", "text");
    await until(5000, "bob gets carol-can", () => bob.inbox.some((m) => m.data === "carol-can"));
    await svc.revokePermission(carol.info.connectionId, "sendToGroup", { targetName: "lobby" });
    t.eq(await svc.hasPermission(carol.info.connectionId, "sendToGroup", { targetName: "lobby" }), false,
      "revoked");

    // Closing a connection from the server: the client sees `disconnected`.
    const gone = deferred();
    carol.client.on("disconnected", (e) => gone.resolve(e));
    await svc.closeConnection(carol.info.connectionId, { reason: "bye" });
    const ev = await within(5000, "carol disconnected", gone.promise);
    t.eq(ev.connectionId, carol.info.connectionId, "disconnected event connection id");
    await until(5000, "carol's connection gone", async () => !(await svc.connectionExists(carol.info.connectionId)));
    t.counts.messagesChecked = bob.inbox.length + alice.inbox.length + carol.inbox.length;
  } finally {
    clients.forEach((c) => c.stop());
    server.stop();
  }
});
