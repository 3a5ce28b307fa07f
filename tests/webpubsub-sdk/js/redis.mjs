// Pieces of the cluster scenarios: a redis-server on a free port and a TCP balancer in
// front of statehub nodes whose routes a scenario changes.

import { spawn } from "node:child_process";
import net from "node:net";
import { WebPubSubClient } from "@azure/web-pubsub-client";
import { scenario, startStatehub, until } from "./lib.mjs";

export async function freePort() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** A redis-server on a free port, without persistence; `kill()` and `start()` again. */
export async function startRedis() {
  const port = await freePort();
  let child = null;
  const redis = {
    url: `redis://127.0.0.1:${port}`,
    async start() {
      child = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1",
        "--save", "", "--appendonly", "no"], { stdio: "ignore" });
      await until(15000, "redis-server accepts connections", () => new Promise((resolve) => {
        const s = net.connect(port, "127.0.0.1");
        s.on("connect", () => { s.destroy(); resolve(true); });
        s.on("error", () => resolve(false));
      }));
    },
    kill() {
      child?.kill("SIGKILL");
      child = null;
    },
  };
  await redis.start();
  return redis;
}

/**
 * A round-robin TCP balancer on a free port over `ports` (127.0.0.1): `route(ports)`
 * changes where new connections go, `dropAll()` resets every connection it carries.
 */
export async function startBalancer(ports) {
  let targets = [...ports];
  let next = 0;
  const pairs = new Set();
  const server = net.createServer((client) => {
    if (targets.length === 0) {
      client.resetAndDestroy();
      return;
    }
    const upstream = net.connect(targets[next++ % targets.length], "127.0.0.1");
    const pair = { client, upstream };
    pairs.add(pair);
    const close = () => {
      if (!pairs.delete(pair)) return;
      client.destroy();
      upstream.destroy();
    };
    client.on("error", close).on("close", close);
    upstream.on("error", close).on("close", close);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    /** Rewrites a statehub URL to go through the balancer. */
    url(u) {
      const url = new URL(u);
      url.port = String(server.address().port);
      return url.toString();
    },
    route(ports) {
      targets = [...ports];
    },
    dropAll() {
      for (const p of [...pairs]) {
        p.client.resetAndDestroy();
        p.upstream.resetAndDestroy();
        pairs.delete(p);
      }
    },
    close() {
      this.dropAll();
      server.close();
    },
  };
}

/**
 * A scenario on one redis-server and statehub nodes `nodes` on it (a namespace of the
 * scenario's own), behind a balancer to the first node if `balanced`. `body(t, cluster)`
 * gets `{ redis, config, servers, clients, lb }`; whatever `servers` and `clients` hold
 * then, the balancer and redis-server are stopped at the end, passed or failed.
 */
export function clusterScenario(name, { prefix, nodes, balanced = false }, body) {
  scenario(name, async (t) => {
    const redis = await startRedis();
    const namespace = `${prefix}${process.pid}`;
    const config = (node) =>
      `[cluster]\nredis_url = "${redis.url}"\nnode_id = "${node}"\nnamespace = "${namespace}"\n`;
    const cluster = { redis, config, servers: [], clients: [], lb: null };
    try {
      for (const node of nodes) cluster.servers.push(await startStatehub(config(node)));
      if (balanced) cluster.lb = await startBalancer([cluster.servers[0].port]);
      await body(t, cluster);
    } finally {
      cluster.clients.forEach((c) => c.stop());
      cluster.lb?.close();
      cluster.servers.forEach((s) => s.stop());
      redis.kill();
    }
  });
}

/**
 * A started SDK client of `svc`'s hub as `userId` (through the cluster's balancer when
 * `viaBalancer`), stopped with the scenario: `seen` holds its group messages' data and
 * connection ids in arrival order, and counts its `disconnected` events.
 */
export async function clusterClient(cluster, svc, userId, roles, groups, viaBalancer = true) {
  const token = await svc.getClientAccessToken({ userId, roles, groups });
  const ws = new WebPubSubClient(viaBalancer ? cluster.lb.url(token.url) : token.url);
  const seen = { got: [], connected: [], disconnected: 0 };
  ws.on("group-message", (e) => seen.got.push(e.message.data));
  ws.on("connected", (e) => seen.connected.push(e.connectionId));
  ws.on("disconnected", () => seen.disconnected++);
  cluster.clients.push(ws);
  await ws.start();
  await until(10000, `${userId} connected`, () => seen.connected.length === 1);
  return { ws, seen };
}
