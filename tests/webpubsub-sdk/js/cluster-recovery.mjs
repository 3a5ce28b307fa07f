// Reliable sessions recovered on another node, with the official JS client unchanged:
// three statehub nodes on one redis-server, a subscriber and a publisher reaching them
// through a TCP balancer.
//  1. The balancer moves to node B and cuts every connection (node A lives on): both
//     clients recover their sessions on B (same connection ids, no `disconnected`, no
//     new connection); every message sent meanwhile, by REST through each node (the old
//     owner, the new one, a third) and by a client on node C, arrives exactly once and
//     in order per origin; the publisher's ackId re-sent after the recovery is
//     answered Duplicate and not delivered again.
//  2. The balancer moves to node C and node B is killed (SIGKILL): the same again.
// Before that, a permission is granted and revoked through C for the subscriber on A.

import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { sleep, until } from "./lib.mjs";
import { clusterClient, clusterScenario } from "./redis.mjs";

clusterScenario("cluster-recovery", { prefix: "wpsr", nodes: ["a", "b", "c"], balanced: true }, async (t, cluster) => {
  const { servers, lb } = cluster;
  const [a, b, c] = servers;
  const hub = "recover";
  const options = { allowInsecureConnection: true, retryOptions: { maxRetries: 0 } };
  const svc = new WebPubSubServiceClient(c.connectionString, hub, options);
  const sub = await clusterClient(cluster, svc, "sub", [], ["g"]);
  const pub = await clusterClient(cluster, svc, "pub", ["webpubsub.sendToGroup"], []);
  const pubC = await clusterClient(cluster, svc, "pubc", ["webpubsub.sendToGroup"], [], false);
  const rest = Object.fromEntries(servers.map((s, k) => [`rest${"abc"[k]}`,
    new WebPubSubServiceClient(s.connectionString, hub, options)]));
  const sent = { resta: 0, restb: 0, restc: 0, client: 0 };
  // Each origin's messages, one after the other: REST through each named node and a
  // client on C (messages of different origins may interleave differently).
  const send = async (n, nodes) => {
    for (let k = 0; k < n; k++) {
      for (const node of nodes) {
        const src = `rest${node}`;
        await rest[src].group("g").sendToAll({ src, i: sent[src]++ });
      }
      await pubC.ws.sendToGroup("g", { src: "client", i: sent.client++ }, "json");
    }
  };
  const from = (src) => sub.seen.got.filter((m) => m.src === src).map((m) => m.i);
  const range = (n) => Array.from({ length: n }, (_, k) => k);
  const allArrived = () => Object.keys(sent).every((src) => from(src).length >= sent[src]);
  const progress = (what) => () => `${what}: ${Object.keys(sent).map((src) => `${src} ${from(src).length}/${sent[src]}`).join(", ")}, connections ${sub.seen.connected.length}`;
  const check = (what) => {
    for (const src of Object.keys(sent)) {
      t.eq(from(src), range(sent[src]), `${what}: every message from ${src} once, in order`);
    }
  };

  await send(10, ["a", "b", "c"]);
  const first = await pub.ws.sendToGroup("g", { src: "ack", i: 1 }, "json", { ackId: 9001 });
  t.eq(first.isDuplicated, false, "the publisher's first send with ackId 9001");
  await until(20000, "the first messages", allArrived);

  // A permission granted and revoked through C for a connection on A.
  const subId = sub.seen.connected[0];
  await svc.grantPermission(subId, "sendToGroup", { targetName: "g" });
  const granted = await sub.ws.sendToGroup("g", { src: "sub", i: 0 }, "json");
  t.eq(granted.isDuplicated, false, "a sendToGroup permission granted through C works on A");
  await svc.revokePermission(subId, "sendToGroup", { targetName: "g" });
  // A applies the revoke when it reads the operation, soon after the REST call.
  let denied = "";
  await until(20000, "the revoke reaches A", async () => {
    try {
      await sub.ws.sendToGroup("g", { src: "sub", i: 1 }, "json");
      return false;
    } catch (e) {
      denied = e.errorDetail?.name ?? String(e);
      return true;
    }
  });
  t.eq(denied, "Forbidden", "revoked through C: refused on A");

  // 1. Connections cut, node A alive: recovery on B.
  lb.route([b.port]);
  lb.dropAll();
  await send(15, ["a", "b", "c"]);
  await until(30000, progress("after the cut"), allArrived);
  let again = null;
  await until(30000, "the publisher's resend is answered", async () => {
    try {
      again = await pub.ws.sendToGroup("g", { src: "ack", i: 1 }, "json", { ackId: 9001 });
      return true;
    } catch {
      await sleep(200);
      return false;
    }
  });
  t.eq(again.isDuplicated, true, "ackId 9001 re-sent after recovering on B: Duplicate");
  await send(1, ["a", "b", "c"]);
  await until(20000, "a message after the resend", allArrived);
  check("recovered on B");
  t.eq(from("ack"), [1], "the duplicate was not delivered again");

  // 2. Node B killed: recovery on C.
  lb.route([c.port]);
  b.stop();
  servers.splice(1, 1);
  await send(15, ["a", "c"]);
  await until(40000, progress("after the kill"), allArrived);
  await sleep(300);
  check("recovered on C after B was killed");
  const again2 = await pub.ws.sendToGroup("g", { src: "ack", i: 1 }, "json", { ackId: 9001 });
  t.eq(again2.isDuplicated, true, "ackId 9001 re-sent after recovering on C: Duplicate");

  for (const [name, c2] of [["subscriber", sub], ["publisher", pub]]) {
    t.eq(c2.seen.connected.length, 1, `${name}: one connection, never a new one`);
    t.eq(c2.seen.disconnected, 0, `${name}: no disconnected event`);
  }
  t.eq(await svc.connectionExists(sub.seen.connected[0]), true, "the subscriber's session lives on");
  t.counts = { ...sent, recoveries: 2 };
});
