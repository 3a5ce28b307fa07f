#!/usr/bin/env python3
"""A round-robin TCP balancer for tests: each new connection on LISTEN goes to the next
backend in turn, bytes piped both ways until either side closes.

    rr_balancer.py LISTEN_HOST:PORT BACKEND_HOST:PORT [BACKEND_HOST:PORT ...]

Prints "listening" on stderr once bound. A backend that refuses the connection is
skipped for that connection (the next one is tried), so clients keep working while a
node is down.
"""
import asyncio
import itertools
import sys


def parse(addr):
    host, _, port = addr.rpartition(":")
    return host, int(port)


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except (ConnectionError, OSError):
            pass


async def main():
    listen = parse(sys.argv[1])
    backends = [parse(a) for a in sys.argv[2:]]
    turn = itertools.cycle(range(len(backends)))

    async def handle(client_reader, client_writer):
        for _ in range(len(backends)):
            host, port = backends[next(turn)]
            try:
                up_reader, up_writer = await asyncio.open_connection(host, port)
                break
            except OSError:
                continue
        else:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, up_writer), pipe(up_reader, client_writer))

    server = await asyncio.start_server(handle, *listen)
    print("listening", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
