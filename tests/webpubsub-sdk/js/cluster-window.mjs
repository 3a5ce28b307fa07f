// A reliable subscriber sees a message only once Redis has it, with the official JS
// client unchanged: node A's writer is blocked (Redis takes no writes), a client of A
// sends to the subscriber's group without ackId (A delivers nothing Redis lacks), A is
// killed, Redis takes writes again and the subscriber recovers on B through the
// balancer. Every REST send acknowledged through B then arrives once, in order: none is
// dropped by the client as a sequence id it has already seen.

import { spawnSync } from "node:child_process";
import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { sleep, startStatehub, until } from "./lib.mjs";
import { clusterClient, clusterScenario, startBalancer } from "./redis.mjs";

clusterScenario("cluster-window", { prefix: "wpsw", nodes: [] }, async (t, cluster) => {
  const redisCli = (...args) =>
    spawnSync("redis-cli", ["-u", cluster.redis.url, ...args], { encoding: "utf8" }).stdout.trim();
  // Redis calls wait long enough for A's writer to stay blocked for the whole scenario.
  for (const node of ["a", "b"]) {
    cluster.servers.push(await startStatehub(`${cluster.config(node)}timeout_ms = 120000\n`));
  }
  const [a, b] = cluster.servers;
  cluster.lb = await startBalancer([a.port]);
  const hub = "window";
  const options = { allowInsecureConnection: true, retryOptions: { maxRetries: 0 } };
  const svcA = new WebPubSubServiceClient(a.connectionString, hub, options);
  const svcB = new WebPubSubServiceClient(b.connectionString, hub, options);
  const sub = await clusterClient(cluster, svcA, "sub", [], ["g"]);
  const roles = ["webpubsub.sendToGroup", "webpubsub.joinLeaveGroup"];
  const pub = await clusterClient(cluster, svcA, "pub", roles, [], false);
  const data = () => sub.seen.got.map((m) => m.i);

  await pub.ws.sendToGroup("g", { i: "before" }, "json");
  await until(20000, "the first message", () => data().includes("before"));

  // Redis stops taking writes; A's writer blocks on its next pipeline (a heartbeat,
  // within 2 s), and what A queues after stays in A.
  t.eq(redisCli("CLIENT", "PAUSE", "100000", "WRITE"), "OK", "redis writes paused");
  await sleep(4000);
  for (let k = 0; k < 5; k++) {
    await pub.ws.sendToGroup("g", { i: `lost${k}` }, "json", { fireAndForget: true });
  }
  await pub.ws.joinGroup("p");
  await sleep(1000);
  const beforeKill = data().length;
  cluster.lb.route([b.port]);
  a.stop();
  cluster.servers.splice(0, 1);
  t.eq(redisCli("CLIENT", "UNPAUSE"), "OK", "redis writes resumed");

  const sent = [];
  for (let k = 0; k < 5; k++) {
    await svcB.group("g").sendToAll({ i: `acked${k}` });
    sent.push(`acked${k}`);
  }
  const acked = () => data().filter((d) => String(d).startsWith("acked"));
  try {
    await until(30000, "the acknowledged sends through B", () => acked().length >= sent.length);
  } catch {
    // Checked below.
  }
  await sleep(300);
  t.eq(acked(), sent, `every acknowledged send once, in order (before the kill it had ${beforeKill}: ${JSON.stringify(data())})`);
  t.eq(sub.seen.connected.length, 1, "the subscriber recovered its session, no new connection");
  t.eq(sub.seen.disconnected, 0, "no disconnected event");
  t.counts = { acked: acked().length, seenBeforeKill: beforeKill };
});
