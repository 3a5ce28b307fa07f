// The Socket.IO side of the reliable fan-out benchmark: connection state recovery
// on (the Socket.IO feature closest to Web PubSub's reliable subprotocol),
// subscribers (auth.role "sub") join one room, and each "pub" event from the
// publisher is relayed to the room, then acknowledged to the publisher, as
// statehub acks a sendToGroup once it is delivered to the group.
//
// Usage: node server.mjs [port]   (0 = a free port; prints "listening on <port>")

import { Server } from "socket.io";

const port = Number(process.argv[2] ?? 0);
const io = new Server({
  serveClient: false,
  transports: ["websocket"],
  connectionStateRecovery: { maxDisconnectionDuration: 60_000, skipMiddlewares: true },
});
io.on("connection", (socket) => {
  if (socket.handshake.auth?.role === "sub") socket.join("bench");
  socket.on("pub", (data, ack) => {
    io.to("bench").emit("msg", data);
    if (typeof ack === "function") ack();
  });
});
io.listen(port);
io.httpServer.on("listening", () => console.log(`listening on ${io.httpServer.address().port}`));
