"""One lock per model name for the repository API's loads and unloads, kept only while someone
holds or waits for it: a client's load of a name the repository lacks leaves nothing behind
(a lock kept per name ever asked grew the server's memory by every made-up name)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Entry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # holding or waiting


class ModelLocks:
    """`async with locks.hold(name)`: one holder per name at a time, first come first served."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        """Names held or waited for now."""
        return len(self._entries)

    @asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        entry = self._entries.setdefault(name, _Entry())
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users:
                del self._entries[name]
