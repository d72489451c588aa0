"""The phase breakdown of a request: the debug view of one, and the histograms on /metrics."""

from __future__ import annotations

import httpx
import openai
import pytest

from shared import phases
from tests.support.fake_engine import FIRST_PHASES, LAST_PHASES, PLACEMENT_S
from tests.support.gateway import ServedGateway

HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.mark.parametrize("stream", [False, True])
def test_one_request_shows_where_its_time_went(
    keyed_gateway: ServedGateway, model_name: str, stream: bool
) -> None:
    url = keyed_gateway.url
    with openai.OpenAI(base_url=f"{url}/v1", api_key="sk-alpha", max_retries=0) as client:
        if stream:
            chunks = list(
                client.chat.completions.create(model=model_name, messages=HELLO, stream=True)
            )
            response_id = chunks[0].id
        else:
            response_id = client.chat.completions.create(model=model_name, messages=HELLO).id
    alice = {"authorization": "Bearer sk-alpha"}
    with httpx.Client(base_url=url, timeout=15) as http:
        view = http.get(f"/debug/requests/{response_id}", headers=alice).json()
        bob = http.get(
            f"/debug/requests/{response_id}", headers={"authorization": "Bearer sk-beta"}
        )
        unknown = http.get("/debug/requests/chatcmpl-nobody", headers=alice)
        anonymous = http.get(f"/debug/requests/{response_id}")
        metrics = http.get("/metrics").text
    assert view["id"] == response_id and view["completion_tokens"] > 1
    timed = view["phases_s"]
    # What the nodes and the scheduler sent arrives as sent.
    assert timed[phases.PLACEMENT] == pytest.approx(PLACEMENT_S)
    for phase, seconds in (FIRST_PHASES | LAST_PHASES).items():
        assert timed[phase] == pytest.approx(seconds), phase
    # The gateway's own, and the rest of the time to first token.
    for phase in (phases.PARSE, phases.SUBMIT, phases.HOPS, phases.INTER_TOKEN):
        assert timed[phase] >= 0, phase
    assert timed[phases.SUBMIT] > 0
    assert (phases.SSE_WRITE in timed) == stream
    # Only the tenant that made it may look.
    assert bob.status_code == 404 and bob.json()["error"]["code"] == "request_not_found"
    assert unknown.status_code == 404
    assert anonymous.status_code == 401
    for phase in (phases.PARSE, phases.PREFILL_COMPUTE, phases.HOPS):
        assert f'crescent_gateway_request_phase_seconds_count{{phase="{phase}"}}' in metrics
