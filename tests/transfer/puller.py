"""A pulling client in its own process, for tests: ``python -m tests.transfer.puller KIND ADDRESS``.

Pulls ``--blocks`` blocks of ``lease-1`` from ADDRESS once and prints ``PULLING``; then pulls
``--lease`` from it back to back until a pull fails, and prints ``FAILED <message>``. With
``--then OTHER``, it then pulls from OTHER and prints ``THEN OK`` once the bytes check out.
A test kills one side while this runs: the process must live through its server's death.
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

from shared.transfer.base import TransferError, create_client
from tests.transfer.peer import LEASE, block_bytes_of


async def pull_until_failure(args: argparse.Namespace) -> None:
    client = create_client(args.kind, timeout_s=args.timeout)
    address = bytes.fromhex(args.address)
    ids = list(range(args.blocks))
    dest = [np.zeros(args.block_bytes, dtype=np.uint8) for _ in ids]
    await client.pull(address, LEASE, ids, dest)
    print("PULLING", flush=True)
    try:
        while True:
            await client.pull(address, args.lease, ids, dest)
    except TransferError as exc:
        print("FAILED", exc, flush=True)
    if args.then:
        await client.pull(bytes.fromhex(args.then), LEASE, ids, dest)
        want = [bytes(block_bytes_of(i, args.block_bytes)) for i in ids]
        if [bytes(d) for d in dest] != want:
            raise SystemExit("THEN pulled the wrong bytes")
        print("THEN OK", flush=True)
    await client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind")
    parser.add_argument("address", help="the server's address, in hex")
    parser.add_argument("--lease", default=LEASE, help="the lease pulled until a pull fails")
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--block-bytes", type=int, default=1_474_560)
    parser.add_argument("--timeout", type=float, default=6.0)
    parser.add_argument("--then", default="", help="a live server's address, in hex")
    asyncio.run(pull_until_failure(parser.parse_args()))


if __name__ == "__main__":
    main()
