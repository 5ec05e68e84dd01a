"""The JSON Schemas the structured-output tests (test_structured_output.py,
test_structured_bulk.py) and the mask benchmark (scripts/bench-grammar)
generate against, and the checks of a generated text: it parses, it
validates (jsonschema_rs, plus the uuid format, which jsonschema_rs leaves
unchecked by default)."""
import json
import uuid

import jsonschema_rs

SCHEMAS = {
    "nested_objects": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"enum": ["Oslo", "Lima", "Pune"]},
                    "zip": {"type": "integer", "minimum": 1000, "maximum": 9999},
                },
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "address"],
        "additionalProperties": False,
    },
    "array_of_enums": {
        "type": "array",
        "items": {"enum": ["red", "green", "blue"]},
        "minItems": 1,
        "maxItems": 4,
    },
    "bounded_integers": {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 9},
            "b": {"type": "integer", "minimum": -50, "maximum": 50},
            "c": {"type": "integer", "minimum": 100, "maximum": 1000},
        },
        "required": ["a", "b", "c"],
        "additionalProperties": False,
    },
    "anyof_two_shapes": {
        "anyOf": [
            {"type": "object",
             "properties": {"kind": {"const": "circle"},
                            "r": {"type": "integer", "minimum": 1, "maximum": 10}},
             "required": ["kind", "r"], "additionalProperties": False},
            {"type": "object",
             "properties": {"kind": {"const": "rect"},
                            "w": {"type": "integer", "minimum": 1, "maximum": 10},
                            "h": {"type": "integer", "minimum": 1, "maximum": 10}},
             "required": ["kind", "w", "h"], "additionalProperties": False},
        ],
    },
    "recursive_tree": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer", "minimum": 0, "maximum": 9},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                             "maxItems": 2},
                },
                "required": ["v", "kids"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    },
    "string_lengths": {
        "type": "object",
        "properties": {
            "s": {"type": "string", "minLength": 2, "maxLength": 5},
            "t": {"type": "string", "maxLength": 3},
        },
        "required": ["s", "t"],
        "additionalProperties": False,
    },
    "no_additional_properties": {
        "type": "object",
        "properties": {"x": {"type": "boolean"}, "y": {"type": "null"},
                       "z": {"type": "number"}},
        "additionalProperties": False,
    },
    "type_arrays": {
        "type": "object",
        "properties": {
            "v": {"type": ["integer", "null"]},
            "w": {"type": ["string", "boolean"], "maxLength": 4},
        },
        "required": ["v", "w"],
        "additionalProperties": False,
    },
    "tuple_prefix_items": {
        "type": "array",
        "prefixItems": [
            {"type": "integer", "minimum": 0, "maximum": 3},
            {"enum": ["on", "off"]},
            {"type": "boolean"},
        ],
        "items": False,
        "minItems": 2,
    },
    "oneof_disjoint": {
        "oneOf": [
            {"type": "string", "maxLength": 4},
            {"type": "integer", "minimum": 0, "maximum": 100},
            {"type": "object", "properties": {"k": {"type": "boolean"}},
             "required": ["k"], "additionalProperties": False},
        ],
    },
    "allof_merged": {
        "type": "object",
        "allOf": [
            {"properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                            "b": {"type": "boolean"}},
             "required": ["a"], "additionalProperties": False},
            {"required": ["b"]},
        ],
    },
    "const_enum_uuid": {
        "type": "object",
        "properties": {
            "status": {"const": "ok"},
            "code": {"enum": [200, 404, 500]},
            "id": {"type": "string", "format": "uuid"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
                     "maxItems": 2},
        },
        "required": ["status", "code", "id"],
        "additionalProperties": False,
    },
}


def response_format(name):
    return {"type": "json_schema",
            "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def _uuids_ok(schema, value, defs=None):
    """jsonschema_rs does not check "format" by default: check uuid here."""
    if isinstance(schema, dict):
        if schema.get("format") == "uuid" and isinstance(value, str):
            assert str(uuid.UUID(value)) == value.lower(), value
        for k, sub in schema.get("properties", {}).items():
            if isinstance(value, dict) and k in value:
                _uuids_ok(sub, value[k])


def check_valid(name, text):
    """text parses and validates against SCHEMAS[name]; the parsed value."""
    value = json.loads(text)
    schema = SCHEMAS[name]
    errors = [e.message for e in jsonschema_rs.validator_for(schema).iter_errors(value)]
    assert not errors, f"{name}: {text!r}: {errors}"
    _uuids_ok(schema, value)
    return value
