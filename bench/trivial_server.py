"""The load generator's ceiling target: answers every request with a fixed tiny JSON body.

uvloop + httptools, keep-alive, nothing else: whatever rate the generator reaches against it is
the most it can measure on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast

import httptools
import uvloop

RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
            b"\r\n{}")


class _Trivial(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.parser = httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_message_complete(self) -> None:
        self.transport.write(RESPONSE)
        if not self.parser.should_keep_alive():
            self.transport.close()


async def _serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Trivial, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    uvloop.run(_serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
