"""One `crescent up --prefill 2 --decode 2 --schedulers 2` for the chaos tests, restarting
what they kill, and a harness on a background event loop that drives faults into it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.chaos import STACK_ARGS, Harness, open_harness, stack_env
from bench.faults import Stack, collect_logs
from shared.tls import TlsSettings
from tests.support.loop import BackgroundLoop
from tests.support.tls import settings_of, stack_certs

pytestmark = pytest.mark.slow


class Chaos:
    """The stack, its harness, and the loop the harness lives on."""

    def __init__(
        self,
        stack: Stack,
        loop: BackgroundLoop,
        harness: Harness,
        tls: TlsSettings | None = None,
    ) -> None:
        self.stack = stack
        self.loop = loop
        self.harness = harness
        self.tls = tls or TlsSettings(tls="auto")  # what a client of its NATS needs

    def run(self, scenario, timeout_s: float = 300):  # type: ignore[no-untyped-def]
        """Runs a scenario; when it fails, the services' logs go with the failure."""
        try:
            return self.loop.run(scenario(self.harness), timeout_s)
        except Exception as exc:
            exc.add_note(collect_logs(self.stack.data_dir))
            raise


@pytest.fixture(scope="session")
def chaos(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Chaos]:
    data_dir = tmp_path_factory.mktemp("chaos")
    # CRESCENT_TEST_TLS=1: TLS on NATS, cachemeta's gRPC and pulls (over TCP, which carries it).
    certs = stack_certs(tmp_path_factory.mktemp("chaos-tls"))
    env = stack_env(cache_dir, "ucx" if certs is None else "tcp")
    stack = Stack.start(data_dir, env | (certs.env() if certs else {}), STACK_ARGS)
    loop = BackgroundLoop()
    try:
        tls = settings_of(certs) if certs else None
        harness = loop.run(open_harness(stack, tls=tls), 180)
        yield Chaos(stack, loop, harness, tls)
        loop.run(harness.beats.close())
        loop.run(harness.client.close())
    finally:
        status = stack.stop()
        loop.close()
    assert status == 0, "".join(stack.output)
