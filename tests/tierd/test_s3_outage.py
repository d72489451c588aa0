"""The S3 store through an outage of its server: refusals within seconds, then recovery
without a restart of the store. Stops this module's own server, so no other test sees it."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.tierd.s3 import S3Config, S3Store, S3Unavailable
from tests.support.s3 import WeedS3
from tests.tierd.blocks import make_block


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_outage_then_recovery(s3_server: WeedS3, s3_config: S3Config, how: str) -> None:
    before = make_block(100_000)
    during = make_block(100_000, first_token=1)

    async def scenario() -> None:
        store = S3Store(s3_config)
        await store.start()
        await store.put(*before)
        try:
            await asyncio.to_thread(getattr(s3_server, how))
            for attempt in (
                store.put(*during),
                store.get(before[0].block_hash),
                store.delete(during[0].block_hash),
                store.scan(),
            ):
                start = time.monotonic()
                with pytest.raises(S3Unavailable):
                    await attempt
                assert time.monotonic() - start < 10
            fresh = S3Store(s3_config)
            with pytest.raises(S3Unavailable):
                await fresh.start()
        finally:
            await asyncio.to_thread(s3_server.start_again)
        # The same client works again, and what was stored before survived.
        assert (await store.get(before[0].block_hash))[1] == before[1]
        await store.put(*during)
        assert (await store.get(during[0].block_hash))[1] == during[1]
        await store.close()

    asyncio.run(scenario())
