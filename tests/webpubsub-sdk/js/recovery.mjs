// Connection recovery with the official JS client behind a fault-injecting proxy:
//  1. the TCP connection is reset while messages flow: the client recovers the same
//     session (no `disconnected` event) and gets every message exactly once, in order;
//  2. the proxy refuses connections until the session's retention (2 s here) has
//     passed: the recovery attempt is accepted and closed with 1008, the client
//     reports `disconnected`, opens a new connection and rejoins its groups.

import { WebPubSubClient } from "@azure/web-pubsub-client";
import { deferred, scenario, sleep, startPublisher, until, watch, withStatehub, within } from "./lib.mjs";

const CONFIG = "[webpubsub.limits]\nsession_retention_secs = 2\n";

scenario("recovery", (t) =>
  withStatehub({ hub: "recovery", config: CONFIG, proxied: true }, async ({ proxy, svc, clients }) => {
    const subToken = await svc.getClientAccessToken({ userId: "sub", roles: ["webpubsub.joinLeaveGroup"] });
    const sub = new WebPubSubClient(proxy.url(subToken.url));
    clients.push(sub);
    const { got, connected: connectedIds, disconnects } = watch(sub, (e) => e);
    await sub.start();
    await sub.joinGroup("g");
    await until(5000, "connected event", () => connectedIds.length === 1);
    const firstId = connectedIds[0];

    const pub = await startPublisher(svc, clients);
    let next = 1;
    const publish = async (n) => {
      for (let k = 0; k < n; k++, next++) await pub.sendToGroup("g", { i: next }, "json");
    };

    // 1. A reset in the middle of the flow, with messages published while it is down.
    await publish(50);
    await until(5000, "50 before the drop", () => got.length >= 50);
    proxy.refuse(true);
    proxy.dropAll();
    await publish(50);
    await sleep(300);
    proxy.refuse(false);
    await publish(50);
    await until(15000, "150 after recovery", () => got.length >= 150);
    await sleep(300);
    t.eq(got.length, 150, "every message once");
    t.ok(got.every((v, i) => v === i + 1), "in order, no gaps or repeats");
    t.eq(disconnects.length, 0, "recovered without a disconnected event");
    t.eq(connectedIds.length, 1, "no new connection");
    t.eq(await svc.connectionExists(firstId), true, "the session lives on");
    t.ok(proxy.drops >= 1, "the proxy dropped the connection");

    // 2. Recovery after the session was deleted: 1008, a new connection, groups rejoined.
    proxy.refuse(true);
    proxy.dropAll();
    await until(10000, "the session to expire", async () => !(await svc.connectionExists(firstId)));
    await publish(5); // lost with the session: nobody holds them
    proxy.refuse(false);
    await until(15000, "a new connection", () => connectedIds.length === 2);
    t.eq(disconnects.length, 1, "one disconnected event after the failed recovery");
    t.ok(connectedIds[1] !== firstId, "a new connection id");
    const before = got.length;
    await until(10000, "group rejoined", async () => {
      await pub.sendToGroup("g", { i: -1 }, "json");
      await sleep(100);
      return got.length > before;
    });
    t.ok(got.slice(before).every((v) => v === -1), "only messages published after the rejoin");
    t.counts.delivered = got.length;
    t.counts.proxyDrops = proxy.drops;
  }),
);
