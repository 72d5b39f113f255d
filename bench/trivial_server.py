"""The load generator's ceiling target: answers every request with a fixed tiny JSON body.

uvloop + httptools, keep-alive, nothing else (serval.loadtest.ceiling's protocol): whatever rate
the generator reaches against it is the most it can measure on this machine.
"""

from __future__ import annotations

import argparse
import asyncio

import uvloop

from serval.loadtest.ceiling import TrivialProtocol


async def _serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(TrivialProtocol, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    uvloop.run(_serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
