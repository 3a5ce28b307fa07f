// MQTT.js against statehub's MQTT over WebSocket (run by
// crates/statehub/tests/mqtt_ws_clients.rs, which starts statehub and drives the TCP
// side with rumqttc).
//
//   node mqttjs.mjs ws://127.0.0.1:PORT/mqtt
//
// Talks to the test on stdout/stdin, one line each: it prints `READY <step>` and waits
// for the test's `GO <step>`. Ends with `RESULT {"passed":n,"failed":[...]}` and exits
// 0 only if every check passed.
import mqtt from 'mqtt';
import readline from 'node:readline';

const url = process.argv[2];
const WAIT_MS = 30000;
const passed = [];
const failed = [];

function check(name, ok, detail = '') {
  if (ok) passed.push(name);
  else failed.push(`${name} ${detail}`.trim());
}

const lines = readline.createInterface({ input: process.stdin });
const waiting = [];
lines.on('line', (line) => {
  const w = waiting.shift();
  if (w) w(line.trim());
});
function nextLine() {
  return new Promise((resolve) => waiting.push(resolve));
}
async function handshake(step) {
  console.log(`READY ${step}`);
  const line = await within(nextLine(), `the test's GO ${step}`);
  if (line !== `GO ${step}`) throw new Error(`expected GO ${step}, got ${line}`);
}

function within(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), WAIT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function connect(options) {
  return within(
    new Promise((resolve, reject) => {
      const client = mqtt.connect(url, { reconnectPeriod: 0, connectTimeout: WAIT_MS, ...options });
      client.once('connect', (connack) => resolve({ client, connack }));
      client.once('error', reject);
    }),
    `CONNACK for ${options.clientId}`,
  );
}

/// The next message on `topic` that `client` receives.
function message(client, topic) {
  return within(
    new Promise((resolve) => {
      const on = (t, payload, packet) => {
        if (t !== topic) return;
        client.removeListener('message', on);
        resolve({ payload: payload.toString(), packet });
      };
      client.on('message', on);
    }),
    `a message on ${topic}`,
  );
}

async function basics(protocolVersion) {
  const tag = `v${protocolVersion}`;
  const { client } = await connect({ clientId: `js-basics-${tag}`, protocolVersion });
  await client.subscribeAsync(`basics/${tag}/#`, { qos: 2 });
  for (const qos of [0, 1, 2]) {
    const topic = `basics/${tag}/q${qos}`;
    const got = message(client, topic);
    await client.publishAsync(topic, `qos ${qos}`, { qos });
    const { payload, packet } = await got;
    check(`${tag} QoS ${qos} round trip`, payload === `qos ${qos}` && packet.qos === qos,
      `${payload} qos ${packet.qos}`);
  }
  // A message larger than one read, split and joined by the WebSocket layers.
  const big = 'x'.repeat(200 * 1024);
  const gotBig = message(client, `basics/${tag}/big`);
  await client.publishAsync(`basics/${tag}/big`, big, { qos: 1 });
  check(`${tag} 200 KiB payload`, (await gotBig).payload === big);
  await client.publishAsync(`retained/${tag}`, 'kept', { qos: 1, retain: true });
  await client.endAsync();

  const { client: late } = await connect({ clientId: `js-late-${tag}`, protocolVersion });
  const retained = message(late, `retained/${tag}`);
  await late.subscribeAsync(`retained/${tag}`, { qos: 1 });
  const { payload, packet } = await retained;
  check(`${tag} retained message`, payload === 'kept' && packet.retain === true,
    `${payload} retain ${packet.retain}`);
  await late.endAsync();
}

/// A TCP client (the test's rumqttc) and this WebSocket client exchange messages.
async function crossTransport() {
  const { client } = await connect({ clientId: 'js-cross', protocolVersion: 5 });
  await client.subscribeAsync('cross/fromtcp', { qos: 1 });
  const fromTcp = message(client, 'cross/fromtcp');
  await handshake('cross');
  const { payload } = await fromTcp;
  check('TCP to WebSocket', payload === 'hello ws', payload);
  await client.publishAsync('cross/fromws', 'hello tcp', { qos: 1 });
  await client.endAsync();
}

/// The session `moved`, connected over TCP by the test (subscribed to moved/#), taken
/// over here: its subscription comes along.
async function takeover() {
  await handshake('takeover');
  const { client, connack } = await connect({
    clientId: 'moved',
    protocolVersion: 5,
    clean: false,
    properties: { sessionExpiryInterval: 300 },
  });
  check('session present after takeover', connack.sessionPresent === true,
    JSON.stringify(connack));
  const got = message(client, 'moved/x');
  await client.publishAsync('moved/x', 'still subscribed', { qos: 1 });
  check('the taken-over subscription delivers', (await got).payload === 'still subscribed');
  await client.endAsync();
}

try {
  await basics(5);
  await basics(4);
  await crossTransport();
  await takeover();
} catch (e) {
  failed.push(`error: ${e.stack || e}`);
}
console.log(`RESULT ${JSON.stringify({ passed: passed.length, failed })}`);
lines.close();
process.exit(failed.length === 0 ? 0 : 1);
