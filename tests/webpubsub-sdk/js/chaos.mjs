// Chaos: publisher and subscriber (both the official JS client) go through a proxy
// that resets every connection a few hundred milliseconds after it was made, while
// 10,000 messages flow to a group. Every message must reach the application exactly
// once and in order, every publish must be acknowledged (its own ackId, so a retry
// after a reset is answered `Duplicate` rather than published twice), and neither
// client may lose its session (no `disconnected` event).
//
// The publisher is paced (500 msg/s by default): the JS client acknowledges about once
// a second, and a subscriber more than `max_unacked_messages` (1000 by default) behind
// is, by design, closed with 1008 and loses its session. Unpaced, this test shows
// exactly that.

import { WebPubSubClient } from "@azure/web-pubsub-client";
import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { scenario, sleep, startProxy, startStatehub, until } from "./lib.mjs";

const TOTAL = Number(process.env.CHAOS_MESSAGES ?? 10000);
const LIFETIME_MS = Number(process.env.CHAOS_LIFETIME_MS ?? 300);
const RATE = Number(process.env.CHAOS_RATE ?? 500);

scenario("chaos", async (t) => {
  const server = await startStatehub();
  const proxy = await startProxy(server.port);
  const svc = new WebPubSubServiceClient(server.connectionString, "chaos", { allowInsecureConnection: true });
  const options = { messageRetryOptions: { maxRetries: 1000, retryDelayInMs: 50 } };
  const clients = [];
  try {
    const subToken = await svc.getClientAccessToken({ userId: "sub", groups: ["chaos"] });
    const pubToken = await svc.getClientAccessToken({ userId: "pub", roles: ["webpubsub.sendToGroup"] });
    const sub = new WebPubSubClient(proxy.url(subToken.url), options);
    const pub = new WebPubSubClient(proxy.url(pubToken.url), options);
    clients.push(sub, pub);
    const disconnects = { sub: 0, pub: 0 };
    sub.on("disconnected", () => disconnects.sub++);
    pub.on("disconnected", () => disconnects.pub++);
    let expected = 1;
    let delivered = 0;
    const disorder = [];
    sub.on("group-message", (e) => {
      delivered++;
      const i = e.message.data.i;
      if (i !== expected && disorder.length < 10) disorder.push({ expected, got: i });
      expected = Math.max(expected, i + 1);
    });
    proxy.dropEvery(LIFETIME_MS);
    await sub.start();
    await pub.start();

    let acked = 0;
    let duplicates = 0;
    let retriedByApp = 0;
    const started = Date.now();
    for (let i = 1; i <= TOTAL; i++) {
      const due = started + (i * 1000) / RATE;
      if (Date.now() < due) await sleep(due - Date.now());
      for (;;) {
        try {
          const r = await pub.sendToGroup("chaos", { i }, "json", { ackId: i });
          acked++;
          if (r.isDuplicated) duplicates++;
          break;
        } catch {
          retriedByApp++;
          await sleep(50);
        }
      }
    }
    await until(60000, `all ${TOTAL} delivered (at ${delivered})`, () => expected > TOTAL);
    await sleep(500);
    const seconds = (Date.now() - started) / 1000;
    proxy.dropEvery(0);
    t.eq(acked, TOTAL, "every publish acknowledged");
    t.eq(delivered, TOTAL, "every message delivered exactly once");
    t.eq(disorder, [], "delivered in order");
    t.eq(disconnects, { sub: 0, pub: 0 }, "no session lost");
    t.ok(proxy.drops >= 10, `the proxy reset connections (${proxy.drops})`);
    t.counts.messages = TOTAL;
    t.counts.proxyDrops = proxy.drops;
    t.counts.duplicateAcks = duplicates;
    t.counts.appRetries = retriedByApp;
    t.counts.seconds = seconds;
  } finally {
    clients.forEach((c) => c.stop());
    proxy.close();
    server.stop();
  }
});
