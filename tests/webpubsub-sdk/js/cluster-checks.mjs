// The service SDK's checks across two statehub nodes on one redis-server: asked through
// node A about a client of node B, groupExists, userExists, connectionExists,
// hasPermission and listConnections answer for the whole cluster, at once after the
// change was acknowledged (a join acked to the client by B; a grant, a revoke, a
// membership change or a close answered through A).

import { WebPubSubClient } from "@azure/web-pubsub-client";
import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { deferred, within } from "./lib.mjs";
import { clusterScenario } from "./redis.mjs";

clusterScenario("cluster-checks", { prefix: "wpsc", nodes: ["a", "b"] }, async (t, cluster) => {
  const { servers, clients } = cluster;
  const [a, b] = servers;
  const hub = "checks";
  const options = { allowInsecureConnection: true, retryOptions: { maxRetries: 0 } };
  const svcA = new WebPubSubServiceClient(a.connectionString, hub, options);
  const svcB = new WebPubSubServiceClient(b.connectionString, hub, options);
  const connect = async (svc, userId, roles) => {
    const token = await svc.getClientAccessToken({ userId, roles });
    const client = new WebPubSubClient(token.url, { autoRejoinGroups: false, autoReconnect: false });
    const connected = deferred();
    client.on("connected", (e) => connected.resolve(e));
    clients.push(client);
    await client.start();
    const info = await within(10000, `${userId} connected`, connected.promise);
    return { client, id: info.connectionId };
  };
  const onB = await connect(svcB, "ub", ["webpubsub.joinLeaveGroup"]);
  t.eq(await svcA.connectionExists(onB.id), true, "connectionExists through A, at once after B's connected");
  t.eq(await svcA.userExists("ub"), true, "userExists through A, at once");

  // Joins acked to the client by B, asked through A right after each ack.
  const J = 10;
  let seen = 0;
  for (let k = 0; k < J; k++) {
    await onB.client.joinGroup(`j${k}`);
    if (await svcA.groupExists(`j${k}`)) seen++;
  }
  t.eq(seen, J, "groupExists through A right after each join B acked");
  t.eq(await svcA.groupExists("nobody"), false, "a group nobody is in");

  // Permissions of B's connection, checked, granted and revoked through A.
  t.eq(await svcA.hasPermission(onB.id, "joinLeaveGroup", { targetName: "j0" }), true,
    "hasPermission through A: the role B's connection got from its token");
  t.eq(await svcA.hasPermission(onB.id, "sendToGroup", { targetName: "s" }), false,
    "hasPermission through A: a permission it lacks");
  let granted = 0;
  let revoked = 0;
  const P = 5;
  for (let k = 0; k < P; k++) {
    await svcA.grantPermission(onB.id, "sendToGroup", { targetName: `s${k}` });
    if (await svcA.hasPermission(onB.id, "sendToGroup", { targetName: `s${k}` })) granted++;
    await svcA.revokePermission(onB.id, "sendToGroup", { targetName: `s${k}` });
    if (!(await svcA.hasPermission(onB.id, "sendToGroup", { targetName: `s${k}` }))) revoked++;
  }
  t.eq([granted, revoked], [P, P], "grants and revokes through A seen through A at once");

  // Membership of B's connection changed through A, asked through A right after.
  let added = 0;
  let removed = 0;
  const R = 10;
  for (let k = 0; k < R; k++) {
    await svcA.group(`r${k}`).addConnection(onB.id);
    if (await svcA.groupExists(`r${k}`)) added++;
    await svcA.group(`r${k}`).removeConnection(onB.id);
    if (!(await svcA.groupExists(`r${k}`))) removed++;
  }
  t.eq([added, removed], [R, R], "addConnection/removeConnection through A seen through A at once");

  // A group's members on both nodes, listed through either node.
  const onA = await connect(svcA, "ua", ["webpubsub.joinLeaveGroup"]);
  await onA.client.joinGroup("j0");
  const want = [onA.id, onB.id].sort();
  for (const [name, svc] of [["A", svcA], ["B", svcB]]) {
    const members = [];
    for await (const m of await svc.group("j0").listConnections({ maxPageSize: 1 })) {
      members.push(m.connectionId);
    }
    t.eq(members, want, `listConnections(j0) through ${name}, one per page: both nodes' members`);
  }

  // Closed through A: gone at once, with its user and the groups only it was in.
  await svcA.closeConnection(onB.id, { reason: "checked" });
  t.eq(await svcA.connectionExists(onB.id), false, "connectionExists through A at once after closing it");
  t.eq(await svcA.userExists("ub"), false, "its user too");
  t.eq(await svcA.groupExists("j1"), false, "its groups too");
  t.eq(await svcA.groupExists("j0"), true, "a group with a member on A stays");
  t.counts = { joins: J, grants: P, memberships: R };
});
