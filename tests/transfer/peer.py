"""A block server in its own process, for tests: ``python -m tests.transfer.peer KIND``.

Prints ``ADDRESS <hex>`` once serving, then serves until its standard input closes. Its blocks
are a pure function of the block id, so the test process knows what every pull must return.
Leases: ``lease-1`` (the blocks), ``slow`` (the blocks, after blocking the server for
``SLOW_S``), ``broken`` (the provider raises); any other lease is unknown.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Sequence

import numpy as np

from shared.transfer.base import BufferLike, create_server

LEASE = "lease-1"
SLOW_S = 1.5


def block_bytes_of(block_id: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng(block_id).integers(0, 256, nbytes, dtype=np.uint8)


class Blocks:
    """The server's pool: ``count`` blocks of ``nbytes``, looked up by lease."""

    def __init__(self, count: int, nbytes: int) -> None:
        self.pool = [block_bytes_of(i, nbytes) for i in range(count)]

    def __call__(self, lease_id: str, block_ids: Sequence[int]) -> Sequence[BufferLike] | None:
        if lease_id == "broken":
            raise RuntimeError("provider bug")
        if lease_id == "slow":
            time.sleep(SLOW_S)  # blocks the server's loop on purpose: a stalled peer
        elif lease_id != LEASE:
            return None
        return [self.pool[i] for i in block_ids]


async def serve(kind: str, count: int, nbytes: int, send_timeout_s: float) -> None:
    server = create_server(kind, Blocks(count, nbytes), send_timeout_s=send_timeout_s)
    await server.start()
    print("ADDRESS", server.address.hex(), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind")
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--block-bytes", type=int, default=1_474_560)
    parser.add_argument("--send-timeout", type=float, default=3.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="peer %(levelname)s %(message)s")
    asyncio.run(serve(args.kind, args.blocks, args.block_bytes, args.send_timeout))


if __name__ == "__main__":
    main()
