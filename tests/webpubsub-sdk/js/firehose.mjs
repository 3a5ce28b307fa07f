// A fast publisher and a reliable subscriber that keeps reading, no network fault:
// 20,000 messages from an unpaced publisher (the official JS client, up to WINDOW
// sends in flight, each awaiting its ack) to a subscriber (the official JS client,
// json.reliable, which acknowledges about once a second, so it always has thousands
// of messages unacknowledged). Every message must arrive, in order, on the one
// connection: no `disconnected` event, no new connection id.

import { WebPubSubClient } from "@azure/web-pubsub-client";
import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { scenario, sleep, startStatehub, until } from "./lib.mjs";

const TOTAL = Number(process.env.FIREHOSE_MESSAGES ?? 20000);
const WINDOW = Number(process.env.FIREHOSE_WINDOW ?? 64);

scenario("firehose", async (t) => {
  const server = await startStatehub();
  const svc = new WebPubSubServiceClient(server.connectionString, "firehose", { allowInsecureConnection: true });
  const clients = [];
  try {
    const subToken = await svc.getClientAccessToken({ userId: "sub", groups: ["g"] });
    const sub = new WebPubSubClient(subToken.url);
    clients.push(sub);
    const connectedIds = [];
    const disconnects = [];
    let expected = 1;
    let delivered = 0;
    const disorder = [];
    sub.on("connected", (e) => connectedIds.push(e.connectionId));
    sub.on("disconnected", (e) => disconnects.push(e.message?.message ?? "(no message)"));
    sub.on("group-message", (e) => {
      delivered++;
      const i = e.message.data.i;
      if (i !== expected && disorder.length < 10) disorder.push({ expected, got: i });
      expected = i + 1;
    });
    await sub.start();
    await until(5000, "connected", () => connectedIds.length === 1);

    const pubToken = await svc.getClientAccessToken({ userId: "pub", roles: ["webpubsub.sendToGroup"] });
    const pub = new WebPubSubClient(pubToken.url);
    clients.push(pub);
    await pub.start();

    // Sends leave in the order they are issued, so the group sees 1, 2, 3...
    let next = 1;
    let acked = 0;
    const started = Date.now();
    const sender = async () => {
      while (next <= TOTAL) {
        const i = next++;
        await pub.sendToGroup("g", { i }, "json");
        acked++;
      }
    };
    await Promise.all(Array.from({ length: WINDOW }, sender));
    const publishSeconds = (Date.now() - started) / 1000;
    await until(60000, () => `all ${TOTAL} delivered (at ${delivered}, disconnects ${JSON.stringify(disconnects)})`,
      () => delivered >= TOTAL || disconnects.length > 0);
    await sleep(300);
    t.eq(acked, TOTAL, "every publish acknowledged");
    t.eq(delivered, TOTAL, "every message delivered once");
    t.eq(disorder, [], "delivered in order");
    t.eq(disconnects, [], "no disconnected event");
    t.eq(connectedIds.length, 1, "one connection id");
    t.eq(await svc.connectionExists(connectedIds[0]), true, "the session lives on");
    t.counts.messages = TOTAL;
    t.counts.publishedPerSecond = Math.round(TOTAL / publishSeconds);
    t.counts.seconds = (Date.now() - started) / 1000;
  } finally {
    clients.forEach((c) => c.stop());
    server.stop();
  }
});
