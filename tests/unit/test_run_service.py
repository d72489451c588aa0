"""run_service ends the process when the service's lifecycle stops by itself: a FATAL task
that fails is logged, the service's stop steps run, and the exit status is non-zero. A stop
signal still ends it cleanly."""

from __future__ import annotations

import textwrap

from shared.lifecycle import Lifecycle
from shared.runtime import lifecycle_of
from tests.unit.test_stop_watchdog import run_and_stop

SERVICE = textwrap.dedent(
    """
    import asyncio, sys
    from shared.lifecycle import Lifecycle
    from shared.runtime import run_service
    from shared.task_policy import OnError

    MODE = sys.argv[1]

    class Node:
        def __init__(self):
            self.lifecycle = Lifecycle("fake")

    class Service:
        def __init__(self):
            self.node = Node()

        async def start(self):
            life = self.node.lifecycle
            life.on_stop("farewell", lambda: print("stop step ran", flush=True))
            if MODE == "fatal":
                life.run("doomed", self.fail, on_error=OnError.FATAL)
            await life.start()
            print("started", flush=True)

        async def fail(self):
            await asyncio.sleep(0.2)  # the task's short life before it breaks: the scenario
            raise RuntimeError("the doomed task broke")

        async def stop(self):
            await self.node.lifecycle.stop()

    async def build():
        return Service()

    run_service("fake", build, stop_grace_s=10.0)
    """
)


def run_fake(mode: str) -> tuple[int, str]:
    """Runs the fake service in a child; ``signal`` mode sends SIGTERM once it started."""
    return run_and_stop(mode, SERVICE, stop=mode == "signal")


def test_a_fatal_task_failure_ends_the_process_after_the_stop_steps() -> None:
    status, output = run_fake("fatal")
    assert status == 1
    assert "a fatal task failure stopped the service" in output
    assert "RuntimeError: the doomed task broke" in output
    assert "stop step ran" in output


def test_a_stop_signal_still_ends_it_cleanly() -> None:
    status, output = run_fake("signal")
    assert status == 0
    assert "stop step ran" in output
    assert "fatal" not in output


class Owner:
    """Holds a lifecycle, as a service or its node does."""

    def __init__(self, lifecycle: object = None, node: object = None) -> None:
        self.lifecycle = lifecycle
        self.node = node


def test_the_lifecycle_is_the_services_own_or_its_nodes() -> None:
    own, nodes = Lifecycle("own"), Lifecycle("node")
    assert lifecycle_of(Owner(own, Owner(nodes))) is own
    assert lifecycle_of(Owner(None, Owner(nodes))) is nodes
    assert lifecycle_of(Owner("not a lifecycle")) is None
    assert lifecycle_of(Owner()) is None
