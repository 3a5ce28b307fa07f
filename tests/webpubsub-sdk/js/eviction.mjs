// The replay buffer's bound (16 KiB here, about 70 messages) with the official JS
// client, behind a proxy:
//  1. 500 messages arrive on the live connection although the buffer holds only the
//     last ~70: the buffer evicts, the connection goes on. Once the client's
//     sequenceAck covers every message, a reset is recovered (no `disconnected`).
//  2. The proxy holds the client's side (its sequenceAcks do not reach the server)
//     while 500 more arrive, then resets: the server can no longer replay what the
//     client has not acknowledged, so the recovery is accepted, told `disconnected`
//     (naming the evicted messages) and closed with 1008; the client reports
//     `disconnected`, starts a new connection and, with its token's group, receives
//     again. Nothing arrives twice or out of order.

import { WebPubSubClient } from "@azure/web-pubsub-client";
import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { scenario, startProxy, startStatehub, until } from "./lib.mjs";

const BURST = 500;

scenario("eviction", async (t) => {
  const server = await startStatehub("[webpubsub.limits]\nreplay_buffer_bytes = 16384\n");
  const proxy = await startProxy(server.port);
  const svc = new WebPubSubServiceClient(server.connectionString, "eviction", { allowInsecureConnection: true });
  const clients = [];
  try {
    const subToken = await svc.getClientAccessToken({
      userId: "sub", groups: ["g"], roles: ["webpubsub.joinLeaveGroup"],
    });
    const sub = new WebPubSubClient(proxy.url(subToken.url));
    clients.push(sub);
    const got = [];
    const connected = [];
    const disconnects = [];
    const acks = [];
    sub.on("group-message", (e) => got.push(e.message.data.i));
    sub.on("connected", (e) => connected.push(e.connectionId));
    sub.on("disconnected", (e) => disconnects.push(e.message?.message ?? "(no message)"));
    // Watch the client's sequenceAcks go out (the SDK has no event for them).
    const sendMessage = sub._sendMessage.bind(sub);
    sub._sendMessage = async (message, signal) => {
      await sendMessage(message, signal);
      if (message.kind === "sequenceAck") acks.push(message.sequenceId);
    };
    await sub.start();
    await until(5000, "connected", () => connected.length === 1);

    const pubToken = await svc.getClientAccessToken({ userId: "pub", roles: ["webpubsub.sendToGroup"] });
    const pub = new WebPubSubClient(pubToken.url);
    clients.push(pub);
    await pub.start();
    let next = 1;
    const publish = async (n) => {
      const end = next + n;
      const sender = async () => {
        while (next < end) await pub.sendToGroup("g", { i: next++ }, "json");
      };
      await Promise.all(Array.from({ length: 16 }, sender));
    };

    // 1. Evictions on a live connection; a recovery the client's ack covers.
    await publish(BURST);
    await until(20000, () => `${BURST} delivered (got ${got.length})`, () => got.length >= BURST);
    t.eq(disconnects, [], "evicting never closed the live connection");
    await until(10000, "a sequenceAck covering every message", () => acks.some((a) => a >= BURST));
    await sub.joinGroup("sync"); // acknowledged: the server has processed the sequenceAck
    proxy.dropAll();
    await publish(10);
    await until(15000, () => `recovered (got ${got.length})`, () => got.length >= BURST + 10);
    t.eq(disconnects, [], "recovered: the ack covered every evicted message");
    t.eq(connected.length, 1, "same connection");

    // 2. Acks held back, so the recovery needs evicted messages.
    proxy.hold(true);
    await publish(BURST);
    await until(20000, () => `${2 * BURST + 10} delivered (got ${got.length})`, () => got.length >= 2 * BURST + 10);
    proxy.dropAll();
    proxy.hold(false);
    await until(15000, "disconnected after the failed recovery", () => disconnects.length === 1);
    t.ok(/cannot be recovered/.test(disconnects[0]), `the disconnected message says why (${disconnects[0]})`);
    await until(15000, "a new connection", () => connected.length === 2);
    t.ok(connected[1] !== connected[0], "a new connection id");
    const before = got.length;
    await until(10000, "messages again on the new connection", async () => {
      await publish(1);
      return got.length > before;
    });
    t.ok(got.every((v, k) => k === 0 || v > got[k - 1]), "nothing twice or out of order");
    t.eq(got.slice(0, 2 * BURST + 10), Array.from({ length: 2 * BURST + 10 }, (_, k) => k + 1),
      "everything delivered before the reset");
    t.counts.delivered = got.length;
    t.counts.disconnectedMessage = disconnects[0];
  } finally {
    clients.forEach((c) => c.stop());
    proxy.close();
    server.stop();
  }
});
