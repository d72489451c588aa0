"""JSON schemas for the grammar benchmark: one per schema feature, each with an instance that
satisfies it and one that breaks only that feature. A library enforces a feature when it
compiles the schema, its matcher accepts the instance token by token and refuses the other
(some token, or the end)."""

from __future__ import annotations

from typing import Any

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "member": {"type": "boolean"},
    },
    "required": ["name", "age", "member"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "customer": PERSON,
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "quantity": {"type": "integer"},
                    "price": {"type": "number"},
                },
                "required": ["sku", "quantity", "price"],
                "additionalProperties": False,
            },
        },
        "notes": {"type": ["string", "null"]},
    },
    "required": ["id", "customer", "items", "notes"],
    "additionalProperties": False,
}
ORDER_INSTANCE = {
    "id": "A-1042",
    "customer": {"name": "Ada Lovelace", "age": 36, "member": True},
    "items": [
        {"sku": "pen-blue", "quantity": 3, "price": 1.25},
        {"sku": "notebook", "quantity": 1, "price": 4.5},
        {"sku": "stapler", "quantity": 2, "price": 7.99},
    ],
    "notes": "leave at the door",
}


def _obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), **extra}


#: feature -> (schema, an instance of it, a value that breaks the feature)
FEATURES: dict[str, tuple[dict[str, Any], Any, Any]] = {
    "flat object": (
        PERSON,
        {"name": "Bob", "age": 42, "member": False},
        {"name": "Bob", "age": "old", "member": False},
    ),
    "nested objects and arrays": (
        ORDER,
        ORDER_INSTANCE,
        {**ORDER_INSTANCE, "items": [{"sku": "pen", "quantity": 1.5, "price": 1}]},
    ),
    "enum": (
        _obj({"color": {"enum": ["red", "green", "blue"]}}),
        {"color": "green"},
        {"color": "pink"},
    ),
    "const": (_obj({"kind": {"const": "point"}}), {"kind": "point"}, {"kind": "line"}),
    "string pattern": (
        _obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}),
        {"code": "ABC-12"},
        {"code": "AB-123"},
    ),
    "format date-time": (
        _obj({"at": {"type": "string", "format": "date-time"}}),
        {"at": "2026-12-03T10:00:00Z"},
        {"at": "yesterday"},
    ),
    "format email": (
        _obj({"mail": {"type": "string", "format": "email"}}),
        {"mail": "ada@example.com"},
        {"mail": "not an address"},
    ),
    "format uuid": (
        _obj({"id": {"type": "string", "format": "uuid"}}),
        {"id": "123e4567-e89b-12d3-a456-426614174000"},
        {"id": "123"},
    ),
    "minLength/maxLength": (
        _obj({"word": {"type": "string", "minLength": 2, "maxLength": 5}}),
        {"word": "moon"},
        {"word": "sunshine"},
    ),
    "minimum/maximum": (
        _obj({"n": {"type": "integer", "minimum": 1, "maximum": 99}}),
        {"n": 42},
        {"n": 100},
    ),
    "exclusiveMinimum": (
        _obj({"x": {"type": "number", "exclusiveMinimum": 0}}),
        {"x": 0.5},
        {"x": 0},
    ),
    "multipleOf": (_obj({"n": {"type": "integer", "multipleOf": 5}}), {"n": 25}, {"n": 26}),
    "minItems/maxItems": (
        _obj(
            {"tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}}
        ),
        {"tags": ["a", "b"]},
        {"tags": ["a", "b", "c", "d"]},
    ),
    "uniqueItems": (
        _obj({"ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}),
        {"ids": [1, 2, 3]},
        {"ids": [1, 1]},
    ),
    "prefixItems (tuple)": (
        _obj(
            {
                "pair": {
                    "type": "array",
                    "prefixItems": [{"type": "string"}, {"type": "integer"}],
                    "items": False,
                }
            }
        ),
        {"pair": ["x", 1]},
        {"pair": [1, "x"]},
    ),
    "anyOf": (
        _obj({"v": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}),
        {"v": "seven"},
        {"v": True},
    ),
    "oneOf": (
        _obj({"v": {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}}),
        {"v": True},
        {"v": "x"},
    ),
    "allOf": (
        {"allOf": [_obj({"a": {"type": "integer"}}), _obj({"b": {"type": "string"}})]},
        {"a": 1, "b": "two"},
        {"a": 1},
    ),
    "$ref and $defs": (
        {"$defs": {"p": PERSON}, **_obj({"owner": {"$ref": "#/$defs/p"}})},
        {"owner": {"name": "Eve", "age": 30, "member": True}},
        {"owner": {"name": "Eve"}},
    ),
    "recursive $ref": (
        {
            "$defs": {
                "node": _obj(
                    {
                        "label": {"type": "string"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                    }
                )
            },
            "$ref": "#/$defs/node",
        },
        {"label": "root", "children": [{"label": "leaf", "children": []}]},
        {"label": "root", "children": [{"label": 3, "children": []}]},
    ),
    "additionalProperties schema": (
        {"type": "object", "additionalProperties": {"type": "integer"}},
        {"apples": 3, "pears": 5},
        {"apples": "three"},
    ),
    "optional properties": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
            "required": ["a"],
            "additionalProperties": False,
        },
        {"a": 1},
        {"b": "x"},
    ),
    "nullable type list": (_obj({"v": {"type": ["integer", "null"]}}), {"v": None}, {"v": "none"}),
    "patternProperties": (
        {
            "type": "object",
            "patternProperties": {"^x_": {"type": "integer"}},
            "additionalProperties": False,
        },
        {"x_a": 1},
        {"x_a": "one"},
    ),
    "minProperties/maxProperties": (
        {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "minProperties": 1,
            "maxProperties": 2,
        },
        {"a": 1},
        {"a": 1, "b": 2, "c": 3},
    ),
    "if/then/else": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "if": {"properties": {"a": {"const": 1}}},
            "then": {"required": ["a"]},
        },
        {"a": 1},
        {},
    ),
    "not": (_obj({"v": {"not": {"type": "string"}}}), {"v": 3}, {"v": "three"}),
    "dependentRequired": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "dependentRequired": {"a": ["b"]},
        },
        {"a": 1, "b": 2},
        {"a": 1},
    ),
}
