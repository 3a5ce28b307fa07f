// The unacknowledged-message bound: a reliable subscriber that does not acknowledge
// (the JS client acks about once a second) while more than `max_unacked_messages`
// (20 here) arrive is told `disconnected`, closed with 1008 and its session deleted;
// the client then starts a new connection, as the SDK does after a 1008.

import { WebPubSubClient } from "@azure/web-pubsub-client";
import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { scenario, sleep, startStatehub, until } from "./lib.mjs";

scenario("overflow", async (t) => {
  const server = await startStatehub("[webpubsub.limits]\nmax_unacked_messages = 20\n");
  const svc = new WebPubSubServiceClient(server.connectionString, "overflow", { allowInsecureConnection: true });
  let sub;
  try {
    const token = await svc.getClientAccessToken({ userId: "slow", groups: ["g"] });
    sub = new WebPubSubClient(token.url);
    const connectedIds = [];
    const disconnects = [];
    let got = 0;
    sub.on("connected", (e) => connectedIds.push(e.connectionId));
    sub.on("disconnected", (e) => disconnects.push(e));
    sub.on("group-message", () => got++);
    await sub.start();
    await until(5000, "connected", () => connectedIds.length === 1);
    // 200 messages at once: far more than 20 before the client's next sequenceAck.
    await Promise.all(Array.from({ length: 200 }, (_, i) => svc.group("g").sendToAll({ i })));
    await until(10000, "disconnected event", () => disconnects.length >= 1);
    t.eq(disconnects[0].connectionId, connectedIds[0], "the overflowing connection was closed");
    const why = disconnects[0].message?.message ?? "";
    t.ok(/unacknowledged/.test(why), `the disconnected system message says why (${JSON.stringify(why)})`);
    t.ok(got < 200, `not all 200 delivered before the close (got ${got})`);
    await until(10000, "session deleted", async () => !(await svc.connectionExists(connectedIds[0])));
    await until(15000, "a new connection", () => connectedIds.length === 2);
    t.ok(connectedIds[1] !== connectedIds[0], "new connection id after 1008");
    await sleep(100);
    t.counts.deliveredBeforeClose = got;
  } finally {
    sub?.stop();
    server.stop();
  }
});
