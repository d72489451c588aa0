"""``/openapi.json`` that tells the truth: the request bodies the routes parse themselves
(strictly, after their own size and depth checks) are described from the same pydantic
models, beside the response models FastAPI documents from the route declarations."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from services.gateway.api_models import ErrorResponse

_REF = "#/components/schemas/{model}"
#: The errors every generation route may answer, besides 200.
GENERATION_ERRORS = (400, 401, 404, 413, 429, 499, 500, 503, 504)
PLAIN_ERRORS = (400, 401, 404, 413, 500)
#: The name of the API key's security scheme.
API_KEY = "ApiKey"


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route for these error statuses, each an ``ErrorResponse``."""
    return {status: {"model": ErrorResponse} for status in statuses}


def event_stream(description: str, chunk: str) -> dict[int | str, dict[str, Any]]:
    """A 200 that may also be a server-sent event stream (``stream: true``), whose events each
    carry one ``chunk`` object as JSON in ``data``, the last one ``[DONE]``."""
    event = {
        "type": "object",
        "description": f"One server-sent event: `data` holds a {chunk} as JSON, or `[DONE]`.",
        "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
        "required": ["data"],
    }
    return {200: {"description": description, "content": {"text/event-stream": {"schema": event}}}}


def require_key(schema: dict[str, Any]) -> dict[str, Any]:
    """Declares the API key (``Authorization: Bearer KEY``) on every operation that may
    answer 401, so that clients generated from the schema, and Swagger UI's Authorize
    button, send it."""
    schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes[API_KEY] = {"type": "http", "scheme": "bearer", "description": "An API key"}
    for operations in schema["paths"].values():
        for operation in operations.values():
            if "401" in operation.get("responses", {}):
                operation["security"] = [{API_KEY: []}]
    return schema


def describe_bodies(
    schema: dict[str, Any],
    bodies: dict[str, tuple[type[BaseModel], ...]],
    model_names: list[str],
) -> dict[str, Any]:
    """Completes a generated schema with the JSON body of each ``POST`` path in ``bodies``:
    one model, or any of several; their ``model`` field takes one of ``model_names``."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, models in bodies.items():
        refs = [_component(model, components, model_names) for model in models]
        body = refs[0] if len(refs) == 1 else {"anyOf": refs}
        schema["paths"][path]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }
    return schema


def _component(
    model: type[BaseModel], components: dict[str, Any], model_names: list[str]
) -> dict[str, str]:
    described = model.model_json_schema(ref_template=_REF)
    components.update(described.pop("$defs", {}))
    field = described.get("properties", {}).get("model")
    if field is not None:
        _name_models(field, model_names)
    components[model.__name__] = described
    return {"$ref": _REF.format(model=model.__name__)}


def _name_models(field: dict[str, Any], names: list[str]) -> None:
    """The served names are the only ``model`` values that do not get a 404."""
    for option in field.get("anyOf", [field]):
        if option.get("type") == "string":
            option["enum"] = list(names)
