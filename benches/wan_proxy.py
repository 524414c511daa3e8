#!/usr/bin/env python3
"""A WAN between a region and the global tier, for benches/regions.sh: a TCP
proxy on 127.0.0.1 that delays every chunk by half the round trip in each
direction, and counts the FCALLs (lease calls) it carries to Redis.

    wan_proxy.py LISTEN_PORT TARGET_PORT RTT_MS COUNT_FILE

COUNT_FILE is rewritten every 200 ms with the number of FCALL commands seen
from clients so far. SIGSTOP on this process is a partition (nothing passes);
SIGCONT heals it. Loopback only.
"""

import asyncio
import os
import sys

LISTEN, TARGET, RTT_MS, COUNT_FILE = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
DELAY = RTT_MS / 2000.0
fcalls = 0


async def pipe(reader, writer, count):
    """Copies reader to writer, each chunk delayed by DELAY (order kept)."""
    global fcalls
    queue = asyncio.Queue()

    async def delayed():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - asyncio.get_running_loop().time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(delayed())
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            if count:
                # RESP: a command's name is a bulk string "$5\r\nFCALL\r\n".
                fcalls += data.upper().count(b"\r\nFCALL\r\n")
            queue.put_nowait((asyncio.get_running_loop().time() + DELAY, data))
    except ConnectionError:
        pass
    queue.put_nowait((0, None))
    await sender


async def handle(client_reader, client_writer):
    try:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", TARGET)
    except OSError:
        client_writer.close()
        return
    await asyncio.gather(
        pipe(client_reader, server_writer, True),
        pipe(server_reader, client_writer, False),
        return_exceptions=True,
    )


async def report():
    while True:
        with open(COUNT_FILE + ".tmp", "w") as f:
            f.write(str(fcalls))
        os.replace(COUNT_FILE + ".tmp", COUNT_FILE)
        await asyncio.sleep(0.2)


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", LISTEN)
    asyncio.create_task(report())
    async with server:
        await server.serve_forever()


asyncio.run(main())
