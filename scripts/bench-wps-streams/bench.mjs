// Client-stream cost on a node's own members: a raw reliable publisher on node A
// streams N fragments to group g; MEMBERS json members on A (and one on B) receive.
// Modes: acked (wait for each streamAck), pipelined (send all, then wait).
// Usage: node bench.mjs <hostA:port> <hostB:port> <mode> <N> <members>
import { createRequire } from "module";
import crypto from "crypto";
const require = createRequire(new URL("../../tests/webpubsub-sdk/js/package.json", import.meta.url));
const WebSocket = require("ws");
const [A, B, mode, Ns, Ms] = process.argv.slice(2);
const N = Number(Ns), MEMBERS = Number(Ms);
const KEY = "bench-streams-key", HUB = "bench";
const b64 = (x) => Buffer.from(typeof x === "string" ? x : JSON.stringify(x)).toString("base64url");
function token(host, sub, role, groups) {
  const h = b64({ alg: "HS256", typ: "JWT" });
  const now = Math.floor(Date.now() / 1000);
  const p = b64({ aud: `http://${host}/client/hubs/${HUB}`, sub, exp: now + 600, iat: now, role, "webpubsub.group": groups });
  const s = crypto.createHmac("sha256", KEY).update(`${h}.${p}`).digest("base64url");
  return `${h}.${p}.${s}`;
}
function open(host, sub, role, groups, proto) {
  return new Promise((res, rej) => {
    const ws = new WebSocket(`ws://${host}/client/hubs/${HUB}?access_token=${token(host, sub, role, groups)}`, proto);
    ws.once("message", () => res(ws));
    ws.once("error", rej);
  });
}
const members = [];
const sent = [];
let done;
const allDone = new Promise((r) => (done = r));
let finished = 0;
for (let i = 0; i < MEMBERS + 1; i++) {
  const host = i < MEMBERS ? A : B;
  const ws = await open(host, `m${i}`, [], ["g"], "json.webpubsub.azure.v1");
  const m = { got: 0, host, last: 0, lat: [] };
  ws.on("message", (d) => {
    const msg = JSON.parse(d);
    if (msg.type !== "message" || !msg.stream) return;
    if (msg.stream.streamSequenceId !== m.last + 1 && !msg.stream.endOfStream) throw new Error(`order ${m.last} -> ${msg.stream.streamSequenceId}`);
    m.last = msg.stream.streamSequenceId;
    if (sent[m.last] !== undefined) m.lat.push(performance.now() - sent[m.last]);
    if (++m.got === N) { m.t = performance.now(); if (++finished === MEMBERS + 1) done(); }
  });
  members.push(m);
}
const pub = await open(A, "pub", ["webpubsub.sendToGroup"], [], "json.reliable.webpubsub.azure.v1");
const acks = [];
pub.on("message", (d) => { const m = JSON.parse(d); if (m.type === "streamAck") { const r = acks.shift(); if (r) r(m); } });
const ack = () => new Promise((r) => acks.push(r));
pub.send(JSON.stringify({ type: "streamStart", streamId: "s", group: "g" }));
await ack();
const frag = (i) => JSON.stringify({ type: "streamData", streamId: "s", streamSequenceId: i, dataType: "text", data: "x".repeat(64) });
const t0 = performance.now();
if (mode === "acked") {
  for (let i = 1; i <= N; i++) { const a = ack(); sent[i] = performance.now(); pub.send(frag(i)); await a; }
} else {
  for (let i = 1; i <= N; i++) pub.send(frag(i));
}
await allDone;
const local = members.filter((m) => m.host === A).map((m) => m.t - t0);
const remote = members.filter((m) => m.host === B).map((m) => m.t - t0);
const rate = (ms) => Math.round((N * 1000) / ms);
const med = (h) => { const l = members.filter((m) => m.host === h).flatMap((m) => m.lat).sort((a, b) => a - b); return l.length ? Number(l[Math.floor(l.length / 2)].toFixed(2)) : null; };
console.log(JSON.stringify({ mode, N, members: MEMBERS, local_per_s: rate(Math.max(...local)), remote_per_s: rate(Math.max(...remote)), local_median_ms: med(A), remote_median_ms: med(B) }));
process.exit(0);
