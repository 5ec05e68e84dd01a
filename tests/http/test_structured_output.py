"""Structured output (response_format, docs/api.md): the shapes accepted and
refused, with the refused schema keyword and its JSON pointer named in the
400; answers that parse and validate on both routes; the mask applied
before every sampling step (greedy, top-k/top-p/min-p, penalties,
logit_bias); EOS only once the value is complete; max_tokens mid-value ->
"length"; stop strings; streaming in whole UTF-8 characters; n > 1; greedy
answers identical alone and in a batch of 8. The bulk runs (hundreds of
sampled answers per schema) are in test_structured_bulk.py."""
import json
import threading

import pytest
import requests

from dolphin_server import check_error, parse_sse
from structured_schemas import SCHEMAS, check_valid, completes_json, response_format

PROMPT = "Answer in JSON:"


def chat(srv, body):
    return srv.post("/v1/chat/completions", body)


def rf_schema(schema):
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}


@pytest.mark.parametrize("schema,pointer", [
    ({"type": "string", "pattern": "^a"}, "'pattern' at /pattern"),
    ({"type": "object", "properties": {"a": {"not": {"type": "null"}}}},
     "'not' at /properties/a/not"),
    ({"type": "object", "properties": {"d": {"type": "string", "format": "email"}}},
     "/properties/d/format"),
    ({"type": "number", "minimum": 0}, "'minimum' at /minimum"),
    ({"type": "object", "patternProperties": {"x": {}}}, "'patternProperties' at /patternProperties"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "'uniqueItems' at /uniqueItems"),
    ({"if": {"type": "string"}, "then": {"maxLength": 2}}, "'if' at /if"),
    ({"$ref": "https://example.com/s.json"}, "$ref"),
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]}, "oneOf"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "allOf"),
    ({"type": "strin"}, "invalid schema"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "invalid schema"),
    ({"$ref": "#/$defs/nowhere"}, "names no definition"),
    ({"enum": ["v%05d" % i for i in range(4000)]}, "max_grammar_states"),
    ({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1,
                      "maxItems": 1}}, "$ref": "#/$defs/n"}, "'minItems' at /$defs/n/minItems"),
    ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"],
      "additionalProperties": False}, "'required' at /required"),
])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_refused_schemas(server, schema, pointer, route):
    body = {"max_tokens": 4, "response_format": rf_schema(schema)}
    body.update({"prompt": "x"} if route == "/v1/completions"
                else {"messages": [{"role": "user", "content": "x"}]})
    r = server.post(route, body)
    check_error(r, 400, param="response_format")
    assert pointer in r.json()["error"]["message"], r.json()


@pytest.mark.parametrize("rf", [
    {"type": "xml"},
    {"type": "json_schema"},
    {"type": "json_schema", "json_schema": {"name": "x"}},
    {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}},
    {"type": "json_schema", "json_schema": {"schema": 5}},
    "json",
])
def test_refused_shapes(server, rf):
    check_error(server.complete({"prompt": "x", "max_tokens": 2, "response_format": rf}), 400,
                param="response_format")


def test_text_is_the_default(server):
    a = server.complete({"prompt": "Once", "max_tokens": 8, "temperature": 0})
    b = server.complete({"prompt": "Once", "max_tokens": 8, "temperature": 0,
                         "response_format": {"type": "text"}})
    assert a.json()["choices"][0]["text"] == b.json()["choices"][0]["text"]


@pytest.mark.parametrize("fixture", ["server", "tiny_server"])
def test_json_object_both_routes(request, fixture):
    srv = request.getfixturevalue(fixture)
    for seed in range(4):
        r = srv.complete({"prompt": PROMPT, "max_tokens": 40, "temperature": 1, "seed": seed,
                          "response_format": {"type": "json_object"}})
        c = r.json()["choices"][0]
        assert c["text"].startswith("{"), c
        assert (c["finish_reason"] == "stop" and isinstance(json.loads(c["text"]), dict)) or \
            (c["finish_reason"] == "length" and completes_json(c["text"])), c
        r = chat(srv, {"messages": [{"role": "user", "content": "Give JSON"}], "max_tokens": 40,
                       "temperature": 1, "seed": seed,
                       "response_format": {"type": "json_object"}})
        c = r.json()["choices"][0]
        text = c["message"]["content"]
        assert (c["finish_reason"] == "stop" and isinstance(json.loads(text), dict)) or \
            (c["finish_reason"] == "length" and completes_json(text)), c


@pytest.mark.parametrize("extra", [
    {"temperature": 0},
    {"temperature": 1.5, "top_k": 3},
    {"temperature": 1, "top_p": 0.3},
    {"temperature": 1, "min_p": 0.2},
    {"temperature": 1, "presence_penalty": 2, "frequency_penalty": 2, "repetition_penalty": 3},
    {"temperature": 0, "logit_bias": {str(i): 100 for i in range(3, 300)}},
])
def test_mask_before_every_sampling_step(tiny_server, extra):
    """Whatever the sampling settings, only allowed tokens come out: a
    logit_bias of +100 on hundreds of tokens does not get one of them in."""
    for name in ("bounded_integers", "array_of_enums", "type_arrays"):
        body = {"prompt": PROMPT, "max_tokens": 60, "seed": 7,
                "response_format": response_format(name), **extra}
        c = tiny_server.complete(body).json()["choices"][0]
        if c["finish_reason"] == "stop":
            check_valid(name, c["text"])
        else:
            assert c["finish_reason"] == "length" and completes_json(c["text"]), c


def test_eos_only_when_complete_and_length_mid_value(tiny_server):
    # ignore_eos does not keep a finished value going: EOS is the only
    # token left, and it ends the answer
    body = {"prompt": PROMPT, "max_tokens": 60, "temperature": 0, "ignore_eos": True,
            "response_format": response_format("tuple_prefix_items")}
    c = tiny_server.complete(body).json()["choices"][0]
    assert c["finish_reason"] == "stop"
    check_valid("tuple_prefix_items", c["text"])
    # cut mid-value
    for n in (1, 2, 3):
        body = {"prompt": PROMPT, "max_tokens": n, "temperature": 0,
                "response_format": response_format("nested_objects")}
        c = tiny_server.complete(body).json()["choices"][0]
        assert c["finish_reason"] == "length", c
        assert completes_json(c["text"]), c
        with pytest.raises(ValueError):
            json.loads(c["text"])


def test_stop_strings_still_apply(tiny_server):
    body = {"prompt": PROMPT, "max_tokens": 60, "temperature": 0,
            "response_format": response_format("bounded_integers")}
    full = tiny_server.complete(body).json()["choices"][0]["text"]
    assert '"b"' in full, full
    r = tiny_server.complete({**body, "stop": ['"b"']}).json()["choices"][0]
    assert r["finish_reason"] == "stop"
    assert r["text"] == full[:full.index('"b"')]


@pytest.mark.parametrize("fixture", ["server", "tiny_server"])
def test_streaming_whole_utf8(request, fixture):
    """Every chunk is whole UTF-8 (no replacement characters from a split
    byte-fallback character); the chunks add up to the unstreamed answer."""
    srv = request.getfixturevalue(fixture)
    for seed in range(3):
        body = {"prompt": PROMPT, "max_tokens": 48, "temperature": 1, "seed": seed,
                "response_format": {"type": "json_object"}}
        whole = srv.complete(body).json()["choices"][0]["text"]
        with requests.post(srv.url + "/v1/completions", json={**body, "stream": True},
                           stream=True, timeout=120) as r:
            assert r.status_code == 200
            events, done = parse_sse(r)
        assert done
        parts = [e["choices"][0]["text"] for e in events if e.get("choices")]
        assert all("\ufffd" not in p for p in parts), parts
        assert "".join(parts) == whole


def test_n_choices_each_valid(tiny_server):
    body = {"prompt": PROMPT, "max_tokens": 48, "temperature": 1, "seed": 3, "n": 3,
            "response_format": response_format("anyof_two_shapes")}
    choices = tiny_server.complete(body).json()["choices"]
    assert len(choices) == 3
    texts = set()
    for c in choices:
        if c["finish_reason"] == "stop":
            check_valid("anyof_two_shapes", c["text"])
        texts.add(c["text"])
    assert len(texts) > 1


@pytest.mark.parametrize("fixture", ["server", "tiny_server"])
def test_greedy_same_alone_and_in_a_batch_of_8(request, fixture):
    """Masks depend on a sequence's own state only: a greedy answer is the
    same alone and among 7 other constrained requests in one batch."""
    srv = request.getfixturevalue(fixture)
    names = ["nested_objects", "recursive_tree", "string_lengths", "oneof_disjoint",
             "const_enum_uuid", "type_arrays", "allof_merged", "array_of_enums"]

    def body(name, temperature=0, seed=0):
        return {"prompt": PROMPT, "max_tokens": 48, "temperature": temperature, "seed": seed,
                "response_format": response_format(name)}

    alone = {n: srv.complete(body(n)).json()["choices"][0]["text"] for n in names[:2]}
    alone["json"] = srv.complete({"prompt": PROMPT, "max_tokens": 48, "temperature": 0,
                                  "response_format": {"type": "json_object"}}
                                 ).json()["choices"][0]["text"]
    for target in ("nested_objects", "json"):
        results, barrier = {}, threading.Barrier(8)
        bodies = [body(target) if target != "json" else
                  {"prompt": PROMPT, "max_tokens": 48, "temperature": 0,
                   "response_format": {"type": "json_object"}}]
        bodies += [body(n, temperature=1, seed=i) for i, n in enumerate(names[1:])]

        def go(i):
            barrier.wait()
            results[i] = srv.complete(bodies[i]).json()["choices"][0]["text"]

        threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results[0] == alone[target], (target, results[0], alone[target])


def test_schema_answers_validate(server):
    for name in sorted(SCHEMAS):
        c = server.complete({"prompt": PROMPT, "max_tokens": 120, "temperature": 0,
                             "response_format": response_format(name)}).json()["choices"][0]
        if c["finish_reason"] == "stop":
            check_valid(name, c["text"])
        else:
            assert c["finish_reason"] == "length" and completes_json(c["text"]), (name, c)


def test_recursive_schema_with_a_finite_value_completes(tiny_server):
    """A recursive schema one of whose branches ends the recursion is
    accepted; greedy decoding ends in a complete, valid value."""
    schema = {"$defs": {"n": {"anyOf": [
        {"type": "null"},
        {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1, "maxItems": 1}]}},
        "$ref": "#/$defs/n"}
    r = tiny_server.complete({"prompt": "[", "max_tokens": 1020, "temperature": 0,
                              "response_format": rf_schema(schema)})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    if ch["finish_reason"] == "stop":
        v = json.loads(ch["text"])
        while isinstance(v, list):
            assert len(v) == 1
            v = v[0]
        assert v is None
    else:
        assert ch["finish_reason"] == "length"


def test_depth_bound_never_stops_mid_value(tiny_server):
    """Near the nesting bound (docs/api.md) only values that can close in
    time may open: a value ended by "stop" is always complete JSON."""
    deep = {"type": "array", "minItems": 1, "maxItems": 1, "items": {
        "type": "array", "minItems": 1, "maxItems": 1, "items": {
            "type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "null"}}}}
    schema = {"$defs": {"n": {"anyOf": [
        {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1, "maxItems": 1},
        deep]}}, "$ref": "#/$defs/n"}
    # logit_bias pushes "[" and " [" (tiny-llama2 ids) so the value reaches
    # the bound; it was cut there with "stop" and no "]" before
    r = tiny_server.complete({"prompt": "[", "max_tokens": 1020, "temperature": 0,
                              "logit_bias": {"29961": 100, "518": 100},
                              "response_format": rf_schema(schema)})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["text"].count("[") >= 500, ch["text"][:80]
    assert ch["finish_reason"] in ("stop", "length"), ch
    if ch["finish_reason"] == "stop":
        json.loads(ch["text"])
    else:
        assert ch["text"].count("]") > 0
