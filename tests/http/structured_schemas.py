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


def completes_json(prefix):
    """True when the text `prefix` can be extended into valid JSON: a
    closing suffix is built from a scan of the prefix (open containers,
    an unfinished string, escape, number or literal) and the whole must
    parse. An answer cut by max_tokens must pass this."""
    stack, i, n = [], 0, len(prefix)
    state = "value"          # what comes next: value, key, colon, comma
    suffix_scalar = ""
    while i < n:
        ch = prefix[i]
        if ch in " \t\r\n":
            i += 1
            continue
        if ch == '"':
            j, esc = i + 1, False
            while j < n and (esc or prefix[j] != '"'):
                esc = not esc and prefix[j] == "\\"
                j += 1
            if j == n:           # the text ends inside this string
                tail = prefix[i + 1:]
                m = len(tail) - len(tail.rstrip("0123456789abcdefABCDEF"))
                u = tail.rfind("\\u")
                if u >= 0 and len(tail) - u - 2 == m and m < 4 and not tail[:u].endswith("\\"):
                    suffix_scalar = "0" * (4 - m)
                elif esc:
                    suffix_scalar = "n"
                suffix_scalar += '"' + (":null" if state == "key" else "")
                state = "comma"
                break
            i = j + 1
            state = "colon" if state == "key" else "comma"
            continue
        if ch in "{[":
            stack.append("}" if ch == "{" else "]")
            state = "key" if ch == "{" else "value"
        elif ch in "}]":
            stack.pop()
            state = "comma"
        elif ch == ":":
            state = "value"
        elif ch == ",":
            state = "key" if stack and stack[-1] == "}" else "value"
        else:                    # a number or a literal, maybe unfinished
            j = i
            while j < n and prefix[j] not in " \t\r\n,:]}":
                j += 1
            word = prefix[i:j]
            if j == n:
                for lit in ("true", "false", "null"):
                    if lit.startswith(word):
                        suffix_scalar = lit[len(word):]
                        break
                else:
                    suffix_scalar = "0" if word[-1] in "-+.eE" else ""
            i = j
            state = "comma"
            continue
        i += 1
    if not suffix_scalar:
        suffix_scalar = {"value": "null" if stack and stack[-1] == "]" or not stack else "",
                         "key": "", "colon": ":null", "comma": ""}[state]
        if state == "value" and stack and stack[-1] == "}":
            suffix_scalar = "null"
        if state == "key" and prefix.rstrip().endswith(","):
            suffix_scalar = '"k":null'
        if state == "value" and stack and stack[-1] == "]" and prefix.rstrip().endswith("["):
            suffix_scalar = ""
    text = prefix + suffix_scalar + "".join(reversed(stack))
    try:
        json.loads(text)
        return True
    except ValueError:
        return False
