// The Web PubSub abuse limits as @azure/web-pubsub-client sees them: on a full hub a
// new client's start() fails (429 at the handshake) instead of retrying, and a
// joinGroup past the group limit rejects with the ack's error, nothing joined.

import { WebPubSubClient } from "@azure/web-pubsub-client";
import { scenario, withStatehub, within } from "./lib.mjs";

const CONFIG = `[webpubsub.limits]
max_connections_per_hub = 2
max_groups_per_connection = 2
`;

scenario("limits", (t) => withStatehub({ hub: "chat", config: CONFIG }, async ({ svc, clients }) => {
  const client = async (roles = []) => {
    const token = await svc.getClientAccessToken({ userId: "u", roles });
    // No message retries: a refused join answers at once.
    const c = new WebPubSubClient(token.url, { messageRetryOptions: { maxRetries: 0 } });
    clients.push(c);
    return c;
  };
  const a = await client(["webpubsub.joinLeaveGroup"]);
  await a.start();
  const b = await client();
  await b.start();

  const third = await client();
  let refused;
  try {
    await within(30000, "the third client's start() settles", third.start());
  } catch (e) {
    refused = e;
  }
  t.ok(refused !== undefined, "a third client's start() fails on a full hub");
  t.ok(!String(refused?.message).startsWith("timed out"), `start() failed, not hung: ${refused?.message}`);

  await a.joinGroup("g1");
  await a.joinGroup("g2");
  let joinError;
  try {
    await within(30000, "the third join settles", a.joinGroup("g3"));
  } catch (e) {
    joinError = e;
  }
  t.ok(joinError !== undefined, "a join past the group limit rejects");
  t.eq(joinError?.errorDetail?.name, "BadRequest", "the ack's error name");
  t.eq(await svc.groupExists("g3"), false, "nothing joined");
  t.eq(await svc.groupExists("g2"), true, "the joins within the limit stand");

  // Room again after a leave.
  await a.leaveGroup("g1");
  await a.joinGroup("g3");
  t.eq(await svc.groupExists("g3"), true, "a join within the limit succeeds");
}));
