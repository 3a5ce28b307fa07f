// Chaos: publisher and subscriber (both the official JS client) go through a proxy
// that resets every connection a few hundred milliseconds after it was made, while
// 20,000 messages flow to a group as fast as the publisher gets its acks (CHAOS_RATE:
// messages per second instead). Every
// publish must be acknowledged (its own ackId, so a retry after a reset is answered
// `Duplicate` rather than published twice) and every message must reach the
// application exactly once and in order.
//
// The only allowed exception is a recovery the server could not serve because its
// replay buffer had evicted messages the client had not acknowledged: then the server
// must say so (a `disconnected` message naming the evicted messages, close 1008), the
// client starts a new session, and the messages published meanwhile are missing, in
// one gap per lost session. The test accounts for each; with the default buffer
// (16 MiB) there are none. CHAOS_CONFIG sets statehub's configuration (a small
// buffer) and CHAOS_EXPECT_LOSS=1 requires a lost session, to show the accounting.

import { WebPubSubClient } from "@azure/web-pubsub-client";
import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { scenario, sleep, startProxy, startStatehub, until } from "./lib.mjs";

const TOTAL = Number(process.env.CHAOS_MESSAGES ?? 20000);
const LIFETIME_MS = Number(process.env.CHAOS_LIFETIME_MS ?? 300);
const RATE = Number(process.env.CHAOS_RATE ?? 0);
const EXPECT_LOSS = process.env.CHAOS_EXPECT_LOSS === "1";
const REPLAY_LOST = /cannot be recovered/;

scenario("chaos", async (t) => {
  const server = await startStatehub(process.env.CHAOS_CONFIG ?? "");
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
    const lost = { sub: [], pub: [] };
    const connected = [];
    sub.on("connected", (e) => connected.push(e.connectionId));
    sub.on("disconnected", (e) => lost.sub.push(e.message?.message ?? "(no message)"));
    pub.on("disconnected", (e) => lost.pub.push(e.message?.message ?? "(no message)"));
    let last = 0;
    let delivered = 0;
    let lastDelivery = Date.now();
    const disorder = [];
    const gaps = [];
    sub.on("group-message", (e) => {
      delivered++;
      lastDelivery = Date.now();
      const i = e.message.data.i;
      if (i <= last && disorder.length < 10) disorder.push({ after: last, got: i });
      if (i > last + 1) gaps.push([last + 1, i - 1]);
      last = Math.max(last, i);
    });
    proxy.dropEvery(LIFETIME_MS);
    await sub.start();
    await pub.start();

    let acked = 0;
    let duplicates = 0;
    let retriedByApp = 0;
    const started = Date.now();
    for (let i = 1; i <= TOTAL; i++) {
      const due = RATE > 0 ? started + (i * 1000) / RATE : 0;
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
    const publishSeconds = (Date.now() - started) / 1000;
    await until(60000, () => `all ${TOTAL} delivered (last ${last}, lost ${JSON.stringify(lost)})`,
      () => last >= TOTAL || (lost.sub.length > 0 && Date.now() - lastDelivery > 5000));
    await sleep(500);
    const seconds = (Date.now() - started) / 1000;
    proxy.dropEvery(0);
    t.eq(acked, TOTAL, "every publish acknowledged");
    t.eq(disorder, [], "no message twice or out of order");
    t.eq(lost.pub, [], "the publisher kept its session");
    t.eq(lost.sub.filter((m) => !REPLAY_LOST.test(m)), [],
      "a session was lost only where the replay buffer could not serve the recovery");
    t.eq(connected.length, 1 + lost.sub.length, "a new connection after each lost session");
    t.ok(gaps.length <= lost.sub.length, `every gap follows a lost session (gaps ${JSON.stringify(gaps)})`);
    const missing = gaps.reduce((n, [a, b]) => n + b - a + 1, 0) + (TOTAL - last);
    t.eq(delivered + missing, TOTAL, "every message delivered once or accounted for");
    t.ok(proxy.drops >= 10, `the proxy reset connections (${proxy.drops})`);
    if (EXPECT_LOSS) t.ok(lost.sub.length > 0, "the small replay buffer cost a session");
    else t.eq(lost.sub, [], "no session lost");
    t.counts.messages = TOTAL;
    t.counts.rate = RATE > 0 ? RATE : "unpaced";
    t.counts.publishedPerSecond = Math.round(TOTAL / publishSeconds);
    t.counts.proxyDrops = proxy.drops;
    t.counts.duplicateAcks = duplicates;
    t.counts.appRetries = retriedByApp;
    t.counts.sessionsLost = lost.sub.length;
    t.counts.messagesLostWithSessions = missing;
    t.counts.seconds = seconds;
  } finally {
    clients.forEach((c) => c.stop());
    proxy.close();
    server.stop();
  }
});
