// Upstream events into an application built with @azure/web-pubsub-express: the
// abuse-protection handshake, a blocking `connect` that renames the user and puts
// the connection into a group (and one that rejects), `connected` and
// `disconnected`, and a user event whose 200 answer goes back to the client as a
// server message, and the same through invokeEvent (client 1.1).

import express from "express";
import { WebPubSubEventHandler } from "@azure/web-pubsub-express";
import { WebPubSubClient } from "@azure/web-pubsub-client";
import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { deferred, scenario, startStatehub, until, within } from "./lib.mjs";

scenario("events", async (t) => {
  const seen = { connect: [], connected: [], disconnected: [], user: [] };
  const handler = new WebPubSubEventHandler("evhub", {
    handleConnect(req, res) {
      seen.connect.push({ userId: req.context.userId, connectionId: req.context.connectionId });
      if (req.context.userId === "banned") {
        res.fail(401, "not welcome");
        return;
      }
      res.success({ userId: `app-${req.context.userId}`, groups: ["from-connect"] });
    },
    onConnected(req) {
      seen.connected.push({ userId: req.context.userId, connectionId: req.context.connectionId });
    },
    onDisconnected(req) {
      seen.disconnected.push({ userId: req.context.userId, connectionId: req.context.connectionId });
    },
    handleUserEvent(req, res) {
      seen.user.push({ event: req.context.eventName, data: req.data, dataType: req.dataType });
      if (req.context.eventName === "echo") res.success(`echo:${req.data}`, "text");
      else if (req.context.eventName === "explode") res.fail(500, "the app failed");
      else res.success();
    },
  });
  const app = express();
  app.use(handler.getMiddleware());
  const http = await new Promise((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  const upstream = `http://127.0.0.1:${http.address().port}/api/webpubsub/hubs/{hub}/`;
  // A reliable session outlives its socket for the retention window (the client may
  // still recover it), and `disconnected` fires when the session ends: 1 s here.
  const server = await startStatehub(`
[webpubsub.limits]
session_retention_secs = 1

[webpubsub.hubs.evhub]
event_handlers = [
  { url_template = "${upstream}", user_event_pattern = "*", system_events = ["connect", "connected", "disconnected"] },
]
`);
  const svc = new WebPubSubServiceClient(server.connectionString, "evhub", { allowInsecureConnection: true });
  const clients = [];
  try {
    const token = await svc.getClientAccessToken({ userId: "ann" });
    const client = new WebPubSubClient(token.url);
    clients.push(client);
    const connected = deferred();
    const serverMessages = [];
    const groupMessages = [];
    client.on("connected", (e) => connected.resolve(e));
    client.on("server-message", (e) => serverMessages.push(e.message.data));
    client.on("group-message", (e) => groupMessages.push(e.message));
    await client.start();
    const info = await within(5000, "connected", connected.promise);
    t.eq(info.userId, "app-ann", "userId set by the connect handler");
    t.eq(seen.connect.map((c) => c.userId), ["ann"], "connect event carries the token's user");
    await until(5000, "connected event upstream", () => seen.connected.length === 1);
    t.eq(seen.connected[0], { userId: "app-ann", connectionId: info.connectionId }, "connected event");

    await svc.group("from-connect").sendToAll("to-the-group", { contentType: "text/plain" });
    await until(5000, "group from the connect handler", () => groupMessages.length === 1);
    t.eq(groupMessages[0].data, "to-the-group", "joined the group the handler named");

    const ack = await client.sendEvent("echo", "hi", "text");
    t.eq(ack.isDuplicated, false, "event acked");
    await until(5000, "echo reply", () => serverMessages.length === 1);
    t.eq(serverMessages, ["echo:hi"], "user event reply as a server message");
    await client.sendEvent("note", { a: 1 }, "json");
    await until(5000, "second user event", () => seen.user.length === 2);
    t.eq(seen.user, [
      { event: "echo", data: "hi", dataType: "text" },
      { event: "note", data: { a: 1 }, dataType: "json" },
    ], "user events as the app saw them");

    // invokeEvent (client 1.1): the same user event, answered as the invocation's result.
    const invoked = await client.invokeEvent("echo", "again", "text");
    t.eq([invoked.dataType, invoked.data], ["text", "echo:again"], "invokeEvent returns the upstream's answer");
    t.eq(serverMessages, ["echo:hi"], "an invocation's answer is not also a server message");
    let invokeFailure = null;
    try {
      await client.invokeEvent("explode", "x", "text");
    } catch (err) {
      invokeFailure = err;
    }
    t.ok(invokeFailure?.errorDetail?.name?.length > 0, `a failing upstream fails the invocation (${invokeFailure?.errorDetail?.name})`);

    const bannedToken = await svc.getClientAccessToken({ userId: "banned" });
    const banned = new WebPubSubClient(bannedToken.url, { autoReconnect: false });
    let rejected = null;
    try {
      await banned.start();
    } catch (err) {
      rejected = err;
    }
    t.ok(rejected !== null, "a connect rejected upstream fails start()");
    banned.stop();

    client.stop();
    await until(10000, "disconnected event upstream", () => seen.disconnected.length === 1);
    t.eq(seen.disconnected[0].connectionId, info.connectionId, "disconnected event connection");
    t.counts.events = seen.connect.length + seen.connected.length + seen.disconnected.length + seen.user.length;
  } finally {
    clients.forEach((c) => c.stop());
    server.stop();
    http.close();
  }
});
