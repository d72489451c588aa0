"""Starting and stopping `crescent up` leaves nothing behind; the TCP transfer path works too."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import OpenAI

from tests.e2e.conftest import ALICE_KEY, stack_env
from tests.e2e.stack import Stack, collect_logs, processes_marked
from tests.support.nats import NatsServer
from tests.support.wait import wait_until

pytestmark = pytest.mark.slow


def test_up_serves_over_tcp_and_stops_without_leftovers(
    tmp_path: Path, cache_dir: Path, nats_server: NatsServer
) -> None:
    # Every request is handed off, so its KV crosses the TCP transfer path.
    env = stack_env(cache_dir, nats_server.url, "tcp") | {"CRESCENT_LOCAL_PREFILL": "false"}
    stack = Stack.start(tmp_path, env)
    try:
        children = processes_marked(stack.up_id)
        assert len(children) >= 4, children  # gateway, scheduler, prefill, decode
        client = OpenAI(base_url=stack.base_url, api_key=ALICE_KEY, max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        reply = client.completions.create(
            model=model, prompt="The capital of France is", max_tokens=8, temperature=0
        )
        assert reply.choices[0].text.strip().startswith("Paris")
    finally:
        status = stack.stop()
    assert status == 0, collect_logs(tmp_path)
    wait_until(lambda: processes_marked(stack.up_id) == [], "every process of the stack gone")


def test_up_with_its_own_nats_server_cleans_up_too(tmp_path: Path, cache_dir: Path) -> None:
    env = stack_env(cache_dir, "", "tcp")
    stack = Stack.start(tmp_path, env)
    names = {Path(f"/proc/{pid}/exe").resolve().name for pid in processes_marked(stack.up_id)}
    assert "nats-server" in names
    assert stack.stop() == 0
    wait_until(lambda: processes_marked(stack.up_id) == [], "every process of the stack gone")
