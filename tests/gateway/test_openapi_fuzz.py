"""The API described by ``/openapi.json`` is the API served: schemathesis generates requests
from the schema (over 1,000 of them) and every answer must be documented, of the documented
content type and shape, and never a server error."""

from __future__ import annotations

from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import checks

from tests.support.gateway import ServedGateway

#: Cases per operation; operations that take no body have few distinct cases to make.
BUDGET = {
    "POST /v1/chat/completions": 400,
    "POST /v1/completions": 300,
    "POST /tokenize": 200,
    "POST /detokenize": 120,
    "POST /v1/responses": 150,
}
OTHER_BUDGET = 25
MIN_CASES = 1000
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


def run_operation(operation: Any, budget: int, counted: list[int]) -> None:
    @settings(
        max_examples=budget,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate, Phase.shrink],
    )
    @given(case=operation.as_strategy())
    def check(case: Any) -> None:
        counted.append(1)
        case.call_and_validate(checks=CHECKS, timeout=30)

    check()


def test_the_schema_describes_every_route_and_body(gateway: ServedGateway) -> None:
    schema = httpx.get(f"{gateway.url}/openapi.json").json()
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize"):
        body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]
    chat = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert {"messages", "model", "frequency_penalty", "logit_bias"} <= set(chat["properties"])
    assert chat["additionalProperties"] is False
    for path in ("/v1/models", "/health", "/metrics", "/debug/requests/{request_id}"):
        assert "200" in next(iter(schema["paths"][path].values()))["responses"]


def test_generated_requests_get_documented_answers(gateway: ServedGateway) -> None:
    schema = schemathesis.openapi.from_url(f"{gateway.url}/openapi.json")
    counted: list[int] = []
    labels = []
    for result in schema.get_all_operations():
        operation = result.ok()
        labels.append(operation.label)
        run_operation(operation, BUDGET.get(operation.label, OTHER_BUDGET), counted)
    assert set(BUDGET) <= set(labels)
    assert len(counted) >= MIN_CASES, f"only {len(counted)} cases ran"
