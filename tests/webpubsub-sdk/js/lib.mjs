// Shared pieces of the JS SDK scenarios: start a statehub on free ports, a
// fault-injecting TCP proxy, and small assertion/timing helpers.
//
// Each scenario is its own script so the Rust launcher (crates/statehub/tests/
// webpubsub_sdk.rs) can run them in parallel; a scenario exits 0 only when every
// check passed, and prints `RESULT <json>` with what it counted.

import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { WebPubSubClient } from "@azure/web-pubsub-client";
import { WebPubSubServiceClient } from "@azure/web-pubsub";

export const ACCESS_KEY = "statehub-sdk-test-key-0123456789abcdef";

/** Starts `statehub serve` on 127.0.0.1:0 with `configToml` and one access key. */
export async function startStatehub(configToml = "") {
  const bin = process.env.STATEHUB_BIN;
  if (!bin) throw new Error("STATEHUB_BIN is not set (the Rust launcher sets it)");
  const dir = mkdtempSync(join(tmpdir(), "statehub-sdk-"));
  const configPath = join(dir, "statehub.toml");
  writeFileSync(configPath, configToml);
  const child = spawn(
    bin,
    ["serve", "--mqtt-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
      "--config", configPath, "--access-key", ACCESS_KEY],
    { env: { ...process.env, RUST_LOG: process.env.STATEHUB_LOG ?? "info", NO_COLOR: "1" },
      stdio: ["ignore", "ignore", "pipe"] },
  );
  const log = [];
  const http = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`statehub did not start:\n${log.join("\n")}`)), 15000);
    child.on("exit", (code) => reject(new Error(`statehub exited (${code}):\n${log.join("\n")}`)));
    createInterface({ input: child.stderr }).on("line", (line) => {
      log.push(line);
      if (log.length > 2000) log.shift();
      const m = line.match(/http listening on (\S+)/);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
  });
  const endpoint = `http://${http}`;
  return {
    endpoint,
    port: Number(http.split(":").pop()),
    pid: child.pid,
    connectionString: `Endpoint=${endpoint};AccessKey=${ACCESS_KEY};Version=1.0;`,
    log,
    stop() {
      child.removeAllListeners("exit");
      child.kill("SIGKILL");
    },
    /** SIGTERM (a graceful shutdown); resolves with the exit code once it exited. */
    terminate() {
      child.removeAllListeners("exit");
      const exited = new Promise((resolve) => child.once("exit", (code) => resolve(code)));
      child.kill("SIGTERM");
      return exited;
    },
  };
}

/**
 * Runs `body({ server, proxy, svc, clients })` against a statehub started with `config`,
 * a proxy in front of it when `proxied` (else null) and a service client for `hub`,
 * then stops every client pushed to `clients`, the proxy and the server, whatever
 * happened.
 */
export async function withStatehub({ hub, config = "", proxied = false }, body) {
  const server = await startStatehub(config);
  const proxy = proxied ? await startProxy(server.port) : null;
  const svc = new WebPubSubServiceClient(server.connectionString, hub, { allowInsecureConnection: true });
  const clients = [];
  try {
    return await body({ server, proxy, svc, clients });
  } finally {
    clients.forEach((c) => c.stop());
    proxy?.close();
    server.stop();
  }
}

/** Starts a client of user "pub", allowed to send to groups, and adds it to `clients`. */
export async function startPublisher(svc, clients) {
  const token = await svc.getClientAccessToken({ userId: "pub", roles: ["webpubsub.sendToGroup"] });
  const pub = new WebPubSubClient(token.url);
  clients.push(pub);
  await pub.start();
  return pub;
}

/**
 * Records what `client` reports, in arrival order: each group message's `i`, each
 * connection id and, per disconnect, `onDisconnected(e)`.
 */
export function watch(client, onDisconnected = (e) => e.message?.message ?? "(no message)") {
  const seen = { got: [], connected: [], disconnects: [] };
  client.on("group-message", (e) => seen.got.push(e.message.data.i));
  client.on("connected", (e) => seen.connected.push(e.connectionId));
  client.on("disconnected", (e) => seen.disconnects.push(onDisconnected(e)));
  return seen;
}

/**
 * A TCP proxy to 127.0.0.1:`targetPort` that can break every connection it carries:
 * `dropAll()` resets them, `refuse(true)` resets new ones on arrival,
 * `dropEvery(ms)` resets each connection `ms` after it was made, and `hold(true)`
 * stops forwarding what clients send (the server's side still flows).
 */
export async function startProxy(targetPort) {
  const pairs = new Set();
  let refusing = false;
  let holding = false;
  let lifetimeMs = 0;
  let drops = 0;
  const server = net.createServer((client) => {
    if (refusing) {
      client.resetAndDestroy();
      return;
    }
    const upstream = net.connect(targetPort, "127.0.0.1");
    const pair = { client, upstream, timer: null };
    pairs.add(pair);
    const close = () => {
      if (!pairs.delete(pair)) return;
      clearTimeout(pair.timer);
      client.destroy();
      upstream.destroy();
    };
    client.on("error", close).on("close", close);
    upstream.on("error", close).on("close", close);
    if (holding) client.pause();
    else client.pipe(upstream);
    upstream.pipe(client);
    if (lifetimeMs > 0) {
      pair.timer = setTimeout(() => {
        drops++;
        client.resetAndDestroy();
        upstream.resetAndDestroy();
        close();
      }, lifetimeMs);
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: server.address().port,
    get drops() {
      return drops;
    },
    get open() {
      return pairs.size;
    },
    /** Rewrites a statehub URL (token URL or endpoint) to go through the proxy. */
    url(u) {
      const url = new URL(u);
      url.port = String(server.address().port);
      return url.toString();
    },
    dropAll() {
      for (const p of [...pairs]) {
        drops++;
        p.client.resetAndDestroy();
        p.upstream.resetAndDestroy();
        pairs.delete(p);
        clearTimeout(p.timer);
      }
    },
    refuse(on) {
      refusing = on;
    },
    hold(on) {
      holding = on;
      for (const p of pairs) {
        if (on) {
          p.client.unpipe(p.upstream);
          p.client.pause();
        } else {
          p.client.pipe(p.upstream);
        }
      }
    },
    dropEvery(ms) {
      lifetimeMs = ms;
    },
    close() {
      this.dropAll();
      server.close();
    },
  };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The resident memory of process `pid`, in KiB (Linux). */
export function rssKiB(pid) {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  return Number(status.match(/^VmRSS:\s+(\d+) kB/m)[1]);
}

/** Resolves with `promise` or rejects after `ms` with `what` in the message. */
export async function within(ms, what, promise) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Polls `cond` every 20 ms until true; rejects after `ms`. `what` may be a function
 * giving the state at the time of the failure. */
export async function until(ms, what, cond) {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) {
      const state = typeof what === "function" ? what() : what;
      throw new Error(`timed out after ${ms} ms waiting for: ${state}`);
    }
    await sleep(20);
  }
}

export function deferred() {
  let resolve, reject;
  const promise = new Promise((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** Collects checks; `finish` prints the result and sets the exit code. */
export class Checks {
  constructor(name) {
    this.name = name;
    this.passed = 0;
    this.failed = [];
    this.counts = {};
  }
  ok(cond, what) {
    if (cond) this.passed++;
    else {
      this.failed.push(what);
      console.error(`FAIL ${this.name}: ${what}`);
    }
  }
  eq(actual, expected, what) {
    const a = JSON.stringify(actual);
    const e = JSON.stringify(expected);
    this.ok(a === e, `${what}: expected ${e}, got ${a}`);
  }
  finish(extra = {}) {
    const result = { scenario: this.name, passed: this.passed, failed: this.failed, ...this.counts, ...extra };
    console.log(`RESULT ${JSON.stringify(result)}`);
    process.exitCode = this.failed.length === 0 && this.passed > 0 ? 0 : 1;
  }
}

/** Runs `body(checks)`; any throw is a failure; always exits. */
export function scenario(name, body) {
  const checks = new Checks(name);
  const watchdog = setTimeout(() => {
    checks.ok(false, "scenario watchdog (120 s) fired");
    checks.finish();
    process.exit(1);
  }, Number(process.env.SCENARIO_TIMEOUT_MS ?? 120000));
  body(checks)
    .catch((err) => checks.ok(false, `threw: ${err?.stack ?? err}`))
    .finally(() => {
      clearTimeout(watchdog);
      checks.finish();
      process.exit();
    });
}
