// Reliable sessions recovered on another node, with the official JS client unchanged:
// three statehub nodes on one redis-server, a subscriber and a publisher reaching them
// through a TCP balancer.
//  1. The balancer moves to node B and cuts every connection (node A lives on): both
//     clients recover their sessions on B (same connection ids, no `disconnected`, no
//     new connection); every message sent meanwhile, by REST and by a client on node C,
//     arrives exactly once and in order; the publisher's ackId re-sent after the
//     recovery is answered Duplicate and not delivered again.
//  2. The balancer moves to node C and node B is killed (SIGKILL): the same again.

import { WebPubSubClient } from "@azure/web-pubsub-client";
import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { scenario, sleep, startStatehub, until } from "./lib.mjs";
import { startBalancer, startRedis } from "./redis.mjs";

scenario("cluster-recovery", async (t) => {
  const redis = await startRedis();
  const namespace = `wpsr${process.pid}`;
  const config = (node) =>
    `[cluster]\nredis_url = "${redis.url}"\nnode_id = "${node}"\nnamespace = "${namespace}"\n`;
  const servers = [];
  const clients = [];
  let lb = null;
  try {
    for (const node of ["a", "b", "c"]) servers.push(await startStatehub(config(node)));
    const [a, b, c] = servers;
    lb = await startBalancer([a.port]);
    const hub = "recover";
    const options = { allowInsecureConnection: true, retryOptions: { maxRetries: 0 } };
    const svc = new WebPubSubServiceClient(c.connectionString, hub, options);
    const client = async (userId, roles, groups, viaBalancer) => {
      const token = await svc.getClientAccessToken({ userId, roles, groups });
      const ws = new WebPubSubClient(viaBalancer ? lb.url(token.url) : token.url);
      const seen = { got: [], connected: [], disconnected: 0 };
      ws.on("group-message", (e) => seen.got.push(e.message.data));
      ws.on("connected", (e) => seen.connected.push(e.connectionId));
      ws.on("disconnected", (e) => { seen.disconnected++; if (process.env.DUMP) console.error("DISCONNECTED", userId, JSON.stringify(e)); });
      clients.push(ws);
      await ws.start();
      await until(10000, `${userId} connected`, () => seen.connected.length === 1);
      return { ws, seen };
    };
    const sub = await client("sub", [], ["g"], true);
    const pub = await client("pub", ["webpubsub.sendToGroup"], [], true);
    const pubC = await client("pubc", ["webpubsub.sendToGroup"], [], false);
    const sent = { rest: 0, client: 0 };
    const send = async (n) => {
      for (let k = 0; k < n; k++) {
        await svc.group("g").sendToAll({ src: "rest", i: sent.rest++ });
        await pubC.ws.sendToGroup("g", { src: "client", i: sent.client++ }, "json");
      }
    };
    const from = (src) => sub.seen.got.filter((m) => m.src === src).map((m) => m.i);
    const range = (n) => Array.from({ length: n }, (_, k) => k);
    const allArrived = () => from("rest").length >= sent.rest && from("client").length >= sent.client;
    const check = (what) => {
      t.eq(from("rest"), range(sent.rest), `${what}: every REST message once, in order`);
      t.eq(from("client"), range(sent.client), `${what}: every client message once, in order`);
    };

    await send(20);
    const first = await pub.ws.sendToGroup("g", { src: "ack", i: 1 }, "json", { ackId: 9001 });
    t.eq(first.isDuplicated, false, "the publisher's first send with ackId 9001");
    await until(20000, "the first messages", allArrived);

    // 1. Connections cut, node A alive: recovery on B.
    lb.route([b.port]);
    lb.dropAll();
    await send(30);
    await until(30000, () => `after the cut: rest ${JSON.stringify(from("rest"))}/${sent.rest} client ${JSON.stringify(from("client"))}/${sent.client} conn ${sub.seen.connected.length} disc ${sub.seen.disconnected}`, allArrived);
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
    await send(1);
    await until(20000, "a message after the resend", allArrived);
    check("recovered on B");
    t.eq(from("ack"), [1], "the duplicate was not delivered again");

    // 2. Node B killed: recovery on C.
    lb.route([c.port]);
    b.stop();
    servers.splice(1, 1);
    await send(30);
    await until(40000, () => `after the kill: ${from("rest").length}/${sent.rest}`, allArrived);
    await sleep(300);
    check("recovered on C after B was killed");
    const again2 = await pub.ws.sendToGroup("g", { src: "ack", i: 1 }, "json", { ackId: 9001 });
    t.eq(again2.isDuplicated, true, "ackId 9001 re-sent after recovering on C: Duplicate");

    for (const [name, c2] of [["subscriber", sub], ["publisher", pub]]) {
      t.eq(c2.seen.connected.length, 1, `${name}: one connection, never a new one`);
      t.eq(c2.seen.disconnected, 0, `${name}: no disconnected event`);
    }
    t.eq(await svc.connectionExists(sub.seen.connected[0]), true, "the subscriber's session lives on");
    t.counts = { rest: sent.rest, client: sent.client, recoveries: 2 };
  } finally {
    if (process.env.DUMP) servers.forEach((s, i) => console.error(`--- node ${i}\n` + s.log.filter((l) => !/DEBUG/.test(l) || /recover|claim|session/i.test(l)).join("\n")));
    clients.forEach((ws) => ws.stop());
    lb?.close();
    servers.forEach((s) => s.stop());
    redis.kill();
  }
});
