// A subscriber that stops reading: a raw WebSocket client (json.reliable, the
// handshake written by hand) joins a group, reads its `connected` message and then
// never reads again, while the official JS client publishes about 96 MB to the group.
// Once the kernel's socket buffers and its outbound queue (1 MiB here) are full, the
// server closes it as a slow consumer (logged, counted) and, as its replay buffer
// (2 MiB here) can then no longer hold what it missed, deletes its session. The
// publisher is served throughout and the server's resident memory stays bounded.

import { randomBytes } from "node:crypto";
import net from "node:net";
import { WebPubSubClient } from "@azure/web-pubsub-client";
import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { rssKiB, scenario, startStatehub, until } from "./lib.mjs";

const MESSAGES = 6000;
const SIZE = 16 * 1024;
const CONFIG = `[webpubsub.limits]
outbound_queue_bytes = 1048576
replay_buffer_bytes = 2097152
`;

/** Opens a json.reliable WebSocket by hand, reads up to its `connected` message, and
 * stops reading. */
async function stalledSubscriber(port, url) {
  const { pathname, search } = new URL(url);
  const socket = net.connect(port, "127.0.0.1");
  const state = { socket, ended: false, bytes: 0 };
  socket.on("close", () => (state.ended = true));
  socket.on("error", () => (state.ended = true));
  socket.write(
    `GET ${pathname}${search} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nUpgrade: websocket\r\n` +
      `Connection: Upgrade\r\nSec-WebSocket-Key: ${randomBytes(16).toString("base64")}\r\n` +
      "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: json.reliable.webpubsub.azure.v1\r\n\r\n",
  );
  let seen = "";
  state.connectionId = await new Promise((resolve, reject) => {
    const onData = (chunk) => {
      seen += chunk.toString("latin1");
      const m = seen.match(/"connectionId":"([^"]+)"/);
      if (m) {
        socket.off("data", onData);
        socket.pause();
        resolve(m[1]);
      }
    };
    socket.on("data", onData);
    socket.on("close", () => reject(new Error(`closed during the handshake: ${seen}`)));
  });
  return state;
}

scenario("slow-consumer", async (t) => {
  const server = await startStatehub(CONFIG);
  const svc = new WebPubSubServiceClient(server.connectionString, "slow", { allowInsecureConnection: true });
  let pub;
  let stalled;
  try {
    const subToken = await svc.getClientAccessToken({ userId: "stalled", groups: ["g"] });
    stalled = await stalledSubscriber(server.port, subToken.url);
    const pubToken = await svc.getClientAccessToken({ userId: "pub", roles: ["webpubsub.sendToGroup"] });
    pub = new WebPubSubClient(pubToken.url);
    await pub.start();
    await pub.sendToGroup("g", "warm-up", "text");

    const before = rssKiB(server.pid);
    let peak = before;
    const sampler = setInterval(() => (peak = Math.max(peak, rssKiB(server.pid))), 20);
    const data = "x".repeat(SIZE);
    let next = 0;
    let acked = 0;
    const sender = async () => {
      while (next++ < MESSAGES) {
        await pub.sendToGroup("g", data, "text");
        acked++;
      }
    };
    await Promise.all(Array.from({ length: 8 }, sender));
    clearInterval(sampler);
    peak = Math.max(peak, rssKiB(server.pid));
    const growthMiB = (peak - before) / 1024;
    const publishedMiB = (MESSAGES * SIZE) / (1 << 20);

    t.eq(acked, MESSAGES, "the publisher was served throughout");
    const logged = () => server.log.find((l) => /slow consumer/.test(l) && l.includes(stalled.connectionId));
    await until(10000, "the slow consumer closed, counted and logged", () => logged() !== undefined);
    const closed = logged();
    await until(10000, "its session deleted", async () => !(await svc.connectionExists(stalled.connectionId)));
    t.ok(growthMiB < publishedMiB / 4,
      `server RSS grew ${growthMiB.toFixed(1)} MiB while ${publishedMiB} MiB went to a client that does not read`);
    stalled.socket.on("data", (chunk) => (stalled.bytes += chunk.length));
    stalled.socket.resume();
    await until(20000, "the stalled client to see its connection end", () => stalled.ended);
    t.ok(stalled.bytes < MESSAGES * SIZE, `it got only part of the data (${stalled.bytes} bytes)`);
    t.counts.rssBeforeKiB = before;
    t.counts.rssPeakKiB = peak;
    t.counts.publishedMiB = publishedMiB;
    t.counts.receivedByStalledMiB = +(stalled.bytes / (1 << 20)).toFixed(1);
    t.counts.logLine = closed;
  } finally {
    stalled?.socket.destroy();
    pub?.stop();
    server.stop();
  }
});
