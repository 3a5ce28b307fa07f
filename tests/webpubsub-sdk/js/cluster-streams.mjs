// A client stream goes on across a recovery on another node, with the official JS client
// unchanged: two statehub nodes on one redis-server, the publisher through a balancer
// to node A, a receiver on node B. The publisher opens a stream to the receiver's group
// and writes; node A is killed (SIGKILL) and the balancer moves to B; the publisher
// keeps writing while it recovers (the SDK pauses the stream and, once recovered, sends
// again from its oldest unacknowledged fragment under the same stream id), then ends
// the stream. The receiver gets every fragment once, in order, and the end; the SDK
// reports no stream error.

import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { sleep, until } from "./lib.mjs";
import { clusterClient, clusterScenario } from "./redis.mjs";

clusterScenario("cluster-streams", { prefix: "wpst", nodes: ["a", "b"], balanced: true }, async (t, cluster) => {
  const { servers, lb } = cluster;
  const [a, b] = servers;
  const hub = "streams";
  const options = { allowInsecureConnection: true, retryOptions: { maxRetries: 0 } };
  const svcB = new WebPubSubServiceClient(b.connectionString, hub, options);
  const recv = await clusterClient(cluster, svcB, "recv", [], ["g"], false);
  const fragments = [];
  let end = null;
  recv.ws.on("group-message", (e) => {
    const s = e.message.stream;
    if (s == null) return;
    if (s.endOfStream) end = s;
    else fragments.push({ seq: s.streamSequenceId, i: e.message.data.i });
  });
  const pub = await clusterClient(cluster, svcB, "pub", ["webpubsub.sendToGroup"], []);
  const stream = await pub.ws.openGroupStream("g", { streamId: "s1" });
  const errors = [];
  stream.onError((e) => errors.push(`${e.name}: ${e.message}`));

  const N = 40;
  const KILL_AT = 20;
  for (let i = 0; i < KILL_AT; i++) {
    await stream.write({ i }, "json");
  }
  await until(20000, "the first fragments reach the receiver", () => fragments.length >= KILL_AT / 2);
  lb.route([b.port]);
  a.stop();
  servers.splice(0, 1);
  for (let i = KILL_AT; i < N; i++) {
    await stream.write({ i }, "json");
  }
  await stream.end();
  await until(40000, () => `the stream's end (${fragments.length} fragments so far)`, () => end !== null);
  await sleep(300);

  const range = Array.from({ length: N }, (_, k) => k);
  t.eq(fragments.map((f) => f.i), range, "every fragment once, in order");
  t.eq(fragments.map((f) => f.seq), range.map((k) => k + 1), "sequence ids 1..N once each");
  t.eq(end.error ?? null, null, "the stream ended without error");
  t.eq(end.streamSequenceId, N + 1, "the end follows the last fragment");
  t.eq(errors, [], "the publisher's SDK reported no stream error");
  t.eq(pub.seen.connected.length, 1, "the publisher recovered its session, no new connection");
  t.eq(pub.seen.disconnected, 0, "no disconnected event");
  t.counts = { fragments: fragments.length };
});
