// The SDKs over TLS: statehub serves HTTPS and WSS with a certificate the Rust
// launcher made (crates/statehub/tests/security.rs sets STATEHUB_HTTP_TLS,
// STATEHUB_TLS_CERT/KEY for the server it starts here, and NODE_EXTRA_CA_CERTS so
// Node trusts the test CA). The REST client mints a token over https://, the client
// connects to the wss:// URL in it, joins a group and gets a message sent by REST.

import { WebPubSubClient } from "@azure/web-pubsub-client";
import { WebPubSubServiceClient } from "@azure/web-pubsub";
import { deferred, scenario, startStatehub, until, within } from "./lib.mjs";

scenario("tls", async (t) => {
  if (process.env.STATEHUB_HTTP_TLS !== "true") throw new Error("run by the Rust launcher with TLS set");
  const server = await startStatehub();
  const endpoint = server.endpoint.replace("http://", "https://");
  const connectionString = `Endpoint=${endpoint};AccessKey=${server.connectionString.match(/AccessKey=([^;]+)/)[1]};Version=1.0;`;
  const hub = "secure";
  const svc = new WebPubSubServiceClient(connectionString, hub);
  let client;
  try {
    const token = await svc.getClientAccessToken({ userId: "tls-user", roles: ["webpubsub.joinLeaveGroup"] });
    t.ok(token.url.startsWith("wss://"), `the client URL is wss:// (${token.url.split("?")[0]})`);
    client = new WebPubSubClient(token.url);
    const inbox = [];
    client.on("group-message", (e) => inbox.push(e.message));
    const connected = deferred();
    client.on("connected", (e) => connected.resolve(e));
    await client.start();
    const info = await within(5000, "connected over wss", connected.promise);
    t.eq(info.userId, "tls-user", "connected event userId");
    await client.joinGroup("vault");
    await svc.group("vault").sendToAll("over https", { contentType: "text/plain" });
    await until(5000, "the group message arrives over wss", () => inbox.length >= 1);
    t.eq(inbox[0].data, "over https", "payload");
    t.ok(await svc.userExists("tls-user"), "REST over https sees the user");
  } finally {
    client?.stop();
    server.stop();
  }
});
