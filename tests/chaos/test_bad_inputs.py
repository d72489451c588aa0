"""Bad input against the live stack: poison sampling values, pathological JSON and forged
heartbeats get refused or dropped, and the stack goes on serving."""

from __future__ import annotations

import json
import time

import httpx
import nats
import pytest

from shared import subjects
from shared.bus import tls_options
from shared.cluster_messages import NodeStatus
from shared.messages import encode
from tests.chaos.conftest import Chaos
from tests.support.wait import wait_for_condition, wait_until

HELLO = [{"role": "user", "content": "Say hello."}]
BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("temperature 1e-300", b"", "temperature"),
    ("temperature 1e-45", b"", "temperature"),
    ("100,000 [", b"[" * 100_000, "nested"),
    ("NaN literal", b'{"model": "m", "messages": [], "temperature": NaN}', "NaN"),
    ("lone surrogate", b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
     "surrogate"),
]  # fmt: skip


def body(chaos: Chaos, name: str, raw: bytes) -> bytes:
    if raw:
        return raw
    temperature = float(name.split()[-1])
    payload = {"model": chaos.harness.model, "messages": HELLO, "temperature": temperature}
    return json.dumps(payload).encode()


def test_poison_values_and_pathological_json_get_400s(chaos: Chaos) -> None:
    url = chaos.stack.base_url
    with httpx.Client(timeout=30) as http:
        for name, raw, word in BAD_BODIES:
            response = http.post(
                f"{url}/chat/completions",
                content=body(chaos, name, raw),
                headers={"content-type": "application/json"},
            )
            assert response.status_code == 400, (name, response.text)
            assert word in response.json()["error"]["message"], name
        ok = http.post(
            f"{url}/chat/completions",
            json={"model": chaos.harness.model, "messages": HELLO, "max_tokens": 4},
        )
        assert ok.status_code == 200


def test_forged_heartbeats_are_refused_or_dropped(chaos: Chaos) -> None:
    where = json.loads((chaos.stack.data_dir / "stack.json").read_text())
    secrets = chaos.stack.data_dir / "secrets"
    password = (secrets / "nats-decode-0.password").read_text().strip()
    tls = tls_options(where["nats_url"], chaos.tls)

    async def forge() -> float:
        with pytest.raises(Exception, match="Authorization"):
            await nats.connect(where["nats_url"], allow_reconnect=False, connect_timeout=2, **tls)
        errors: list[Exception] = []

        async def on_error(exc: Exception) -> None:
            errors.append(exc)

        nc = await nats.connect(
            where["nats_url"], user="decode-0", password=password,
            inbox_prefix="_INBOX.decode-0", error_cb=on_error, **tls,
        )  # fmt: skip
        # A decode node's credentials cannot speak for a prefill node...
        lie = NodeStatus(node_id="prefill-0", role="prefill", draining=True)
        await nc.publish(subjects.heartbeats("prefill", "prefill-0"), encode(lie))
        # ...nor for another decode node...
        await nc.publish(subjects.heartbeats("decode", "decode-1"), encode(lie))
        # ...and an absurd value on its own subject does not decode anywhere.
        absurd = encode(NodeStatus(node_id="decode-0", role="decode")).replace(
            b'"block_size":32', b'"block_size":0'
        )
        await nc.publish(subjects.heartbeats("decode", "decode-0"), absurd)
        await nc.flush()
        await wait_for_condition(
            lambda: any("permissions violation" in str(e).lower() for e in errors),
            "the server to refuse the forged heartbeats",
        )
        await nc.close()
        return time.monotonic()

    forged = chaos.loop.run(forge(), 30)
    latest = chaos.harness.beats.latest
    wait_until(
        lambda: all(latest[n][0] > forged for n in ("prefill-0", "decode-0")),
        "a heartbeat of each node after the forged ones",
    )
    _, prefill = latest["prefill-0"]
    _, decode = latest["decode-0"]
    assert not prefill.draining and decode.block_size == 32

    def dropped() -> bool:
        logs = chaos.stack.log("scheduler-0") + chaos.stack.log("scheduler-1")
        return "dropped a malformed NodeStatus" in logs

    wait_until(dropped, "a scheduler to drop the malformed heartbeat")
    ok = chaos.run(lambda h: h.stream("Say hello.", 4))
    assert ok.completed
