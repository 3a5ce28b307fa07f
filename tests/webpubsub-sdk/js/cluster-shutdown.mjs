// A graceful shutdown hands reliable sessions to another node, with the official JS
// client unchanged: two statehub nodes on one redis-server, a subscriber and a
// publisher reaching node A through a TCP balancer, REST sends through node B. The
// balancer moves to B and A gets SIGTERM while the REST sends go on: both clients
// recover their sessions on B (same connection ids, no `disconnected`, no new
// connection) and every message arrives exactly once, in order per origin.

import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { sleep, until } from "./lib.mjs";
import { clusterClient, clusterScenario } from "./redis.mjs";

clusterScenario("cluster-shutdown", { prefix: "wpss", nodes: ["a", "b"], balanced: true }, async (t, cluster) => {
  const { servers, lb } = cluster;
  const [a, b] = servers;
  const hub = "handover";
  const options = { allowInsecureConnection: true, retryOptions: { maxRetries: 0 } };
  const svc = new WebPubSubServiceClient(b.connectionString, hub, options);
  const sub = await clusterClient(cluster, svc, "sub", [], ["g"]);
  const pub = await clusterClient(cluster, svc, "pub", ["webpubsub.sendToGroup"], []);
  const sent = { rest: 0, client: 0 };
  const restSend = () => svc.group("g").sendToAll({ src: "rest", i: sent.rest++ });
  // A client send that fails while its connection moves is sent again with the same
  // ackId: if the first one was processed, the retry is answered Duplicate.
  let ackId = 1;
  const clientSend = async () => {
    const data = { src: "client", i: sent.client++ };
    const id = ackId++;
    await until(30000, `client send ${data.i}`, async () => {
      try {
        await pub.ws.sendToGroup("g", data, "json", { ackId: id });
        return true;
      } catch {
        await sleep(100);
        return false;
      }
    });
  };
  const from = (src) => sub.seen.got.filter((m) => m.src === src).map((m) => m.i);
  const range = (n) => Array.from({ length: n }, (_, k) => k);
  const allArrived = () => Object.keys(sent).every((src) => from(src).length >= sent[src]);
  const progress = (what) => () =>
    `${what}: ${Object.keys(sent).map((src) => `${src} ${from(src).length}/${sent[src]}`).join(", ")}`;

  for (let k = 0; k < 20; k++) {
    await restSend();
    await clientSend();
  }
  await until(20000, progress("before the shutdown"), allArrived);

  // A leaves gracefully while REST sends through B go on.
  lb.route([b.port]);
  let sending = true;
  const during = (async () => {
    while (sending) {
      await restSend();
      await sleep(5);
    }
  })();
  const code = await a.terminate();
  servers.splice(0, 1);
  t.eq(code, 0, "node A exits cleanly on SIGTERM");
  await sleep(200);
  sending = false;
  await during;
  for (let k = 0; k < 20; k++) {
    await restSend();
    await clientSend();
  }
  await until(40000, progress("after the shutdown"), allArrived);
  await sleep(300);
  for (const src of Object.keys(sent)) {
    t.eq(from(src), range(sent[src]), `every message from ${src} once, in order, across A's shutdown`);
  }
  for (const [name, c] of [["subscriber", sub], ["publisher", pub]]) {
    t.eq(c.seen.connected.length, 1, `${name}: one connection, never a new one`);
    t.eq(c.seen.disconnected, 0, `${name}: no disconnected event`);
  }
  t.eq(await svc.connectionExists(sub.seen.connected[0]), true, "the subscriber's session lives on, on B");
  t.counts = { ...sent };
});
