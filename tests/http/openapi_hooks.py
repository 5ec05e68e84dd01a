"""schemathesis hooks for tests/http/test_openapi.py (loaded through
SCHEMATHESIS_HOOKS=openapi_hooks by the `schemathesis run` it starts).

docs/openapi.yaml states the contract for any model. A few of its bounds
depend on the served model or on other fields and cannot be written as JSON
Schema (token ids below the vocabulary size, prompt + max_tokens within the
context, best_of equal to n, the chat role order); the server refuses
breaking them with a 400, as the spec's descriptions say. So that
schemathesis's positive cases are really valid for the model under test, and
generation stays fast, this hook adjusts each request body just before it is
sent, always keeping it as valid or invalid against the schema as it was:

- max_tokens / max_completion_tokens in [9, 2^53 - 1] become 1..8 (generation
  time; 0 and out-of-range values are left alone);
- prompts and chat messages are shortened (text to a few hundred bytes,
  id lists to 300 ids, conversations to 5 messages of at most 60 bytes)
  so that they fit in stories260K's 512-token context;
- token ids (prompt arrays, logit_bias keys) at or above the vocabulary size
  are taken modulo it; negative ones are left alone;
- best_of, when it is a valid choice count, is set equal to n;
- a chat conversation whose roles are all valid gets them reordered into
  (system,) user, assistant, ..., user;
- a model name (string) is replaced by the served one half of the time
  (deterministically), so both the 200 and the 404 paths are exercised;
- a chat request with no length limit gets max_tokens 8.
- a response_format json_schema's `schema`, when it is an object or a
  boolean (valid for the spec, which cannot state the supported subset of
  JSON Schema), becomes one schema from that subset.

- a `seed` outside the 64-bit range that a JSON parser reading numbers as
  doubles cannot tell from one inside it (-2^63 - 1 is the same double as
  -2^63; the spec's Seed says so) is moved further out (to -2^64 or 2^65),
  so the case stays invalid and the server can see it.

It also registers a check, `sse_events_conform`: each event of a
text/event-stream answer must be `data: <JSON>` whose JSON matches the
`contentSchema` the spec gives for that route's events, and the stream must
end with `data: [DONE]` (schemathesis itself validates each event's fields
but not the JSON inside them).

Nothing here touches a value that makes a case invalid, so negative cases
stay negative. Environment: DOLPHIN_OPENAPI_MODEL (served model id),
DOLPHIN_OPENAPI_VOCAB (vocabulary size).
"""
import json
import os
import re
import zlib
from pathlib import Path

import jsonschema_rs
import schemathesis
import yaml

MODEL = os.environ.get("DOLPHIN_OPENAPI_MODEL", "stories260K")
VOCAB = int(os.environ.get("DOLPHIN_OPENAPI_VOCAB", "512"))
MAX_N = 8           # the spec's maximum for n and best_of
TOKENS_MAX = 2 ** 53 - 1
FAST_TOKENS = 8
SEED_MIN, SEED_MAX = -(2 ** 63), 2 ** 64 - 1
SPEC = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"

def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _int_like(v):
    """An integer, or a float with an integral value (JSON Schema's integer)."""
    if _is_int(v):
        return True
    return isinstance(v, float) and v == v and v not in (float("inf"), float("-inf")) and v == int(v)


def _small_tokens(v):
    if _int_like(v) and FAST_TOKENS < v <= TOKENS_MAX:
        return int(v) % FAST_TOKENS + 1
    return v


PROMPT_BYTES = 300
MESSAGES = 5
MESSAGE_BYTES = 60


def _cut(s, limit):
    """s shortened to at most `limit` UTF-8 bytes, at a character boundary."""
    if not isinstance(s, str) or len(s.encode("utf-8", "surrogatepass")) <= limit:
        return s
    out, n = [], 0
    for ch in s:
        n += len(ch.encode("utf-8", "surrogatepass"))
        if n > limit:
            break
        out.append(ch)
    return "".join(out)


def _ids(a):
    if isinstance(a, list) and a and all(_int_like(x) and not isinstance(x, bool) for x in a):
        return [int(x) % VOCAB if x >= VOCAB else x for x in a]
    return a


def _prompt(p):
    if isinstance(p, str):
        return _cut(p, PROMPT_BYTES)
    if isinstance(p, list) and p and all(isinstance(x, list) for x in p):
        return [_ids(x[:PROMPT_BYTES]) for x in p]
    if isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        return [_cut(x, PROMPT_BYTES) for x in p]
    if isinstance(p, list):
        return _ids(p[:PROMPT_BYTES])
    return p


def _short_messages(msgs):
    """At most MESSAGES messages, each with at most MESSAGE_BYTES of text."""
    if not isinstance(msgs, list) or len(msgs) > 4096:
        return msgs
    out = []
    for m in msgs[:MESSAGES]:
        if isinstance(m, dict):
            m = dict(m)
            c = m.get("content")
            if isinstance(c, str):
                m["content"] = _cut(c, MESSAGE_BYTES)
            elif isinstance(c, list):
                parts = []
                for part in c[:2]:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        part = dict(part, text=_cut(part["text"], MESSAGE_BYTES // 2))
                    parts.append(part)
                m["content"] = parts
        out.append(m)
    return out


def _logit_bias(lb):
    if not isinstance(lb, dict):
        return lb
    out = {}
    for k, v in lb.items():
        if isinstance(k, str) and k.isascii() and k.isdigit() and int(k) >= VOCAB:
            k = str(int(k) % VOCAB)
        out[k] = v
    return out


ROLES = {"system", "developer", "user", "assistant"}


def _roles(msgs):
    """Reorder the roles of a conversation whose messages are all well
    formed into (system,) user, assistant, ..., user. Content that is null or
    absent is only allowed for an assistant, so a message that must become
    another role gets "" instead."""
    if not isinstance(msgs, list) or not msgs:
        return msgs
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and m["role"] in ROLES
               for m in msgs):
        return msgs
    msgs = [dict(m) for m in msgs]
    first = 1 if msgs[0]["role"] in ("system", "developer") else 0
    if (len(msgs) - first) % 2 == 0:
        # An even number of turns: the leading message changes sides (a
        # system prompt becomes the first user turn, or the first turn the
        # system prompt); system and user content is never null.
        if first == 0:
            msgs[0]["role"] = "system"
            if msgs[0].get("content") is None:
                msgs[0]["content"] = ""
        first = 1 - first
    for i in range(first, len(msgs)):
        role = "user" if (i - first) % 2 == 0 else "assistant"
        msgs[i]["role"] = role
        if role != "assistant" and msgs[i].get("content") is None:
            msgs[i]["content"] = ""
    return msgs


def _seed(v):
    if not _is_int(v) or SEED_MIN <= v <= SEED_MAX:
        return v
    try:
        d = float(v)
    except OverflowError:
        return v
    if SEED_MIN <= d <= float(2 ** 64):   # the same double as a valid seed
        return -(2 ** 64) if v < 0 else 2 ** 65
    return v


def _model(body):
    m = body.get("model")
    if isinstance(m, str) and zlib.crc32(m.encode("utf-8", "surrogatepass")) % 2 == 0:
        body["model"] = MODEL


SUPPORTED_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                             "maximum": 9}},
                    "required": ["a"], "additionalProperties": False}


def _schema(body):
    rf = body.get("response_format")
    js = rf.get("json_schema") if isinstance(rf, dict) else None
    if isinstance(js, dict) and isinstance(js.get("schema"), (dict, bool)):
        js["schema"] = SUPPORTED_SCHEMA


@schemathesis.hook
def before_call(context, case, kwargs):
    body = case.body
    if not isinstance(body, dict):
        return
    path = case.operation.path
    if path in ("/v1/completions", "/v1/chat/completions"):
        for k in ("max_tokens", "max_completion_tokens"):
            if k in body:
                body[k] = _small_tokens(body[k])
        if "prompt" in body:
            body["prompt"] = _prompt(body["prompt"])
        if "logit_bias" in body:
            body["logit_bias"] = _logit_bias(body["logit_bias"])
        bo = body.get("best_of")
        if _int_like(bo) and 1 <= bo <= MAX_N:
            n = body.get("n")
            body["best_of"] = n if _int_like(n) and 1 <= n <= MAX_N else 1
        if path == "/v1/chat/completions":
            if "messages" in body:
                body["messages"] = _roles(_short_messages(body["messages"]))
            if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
                body["max_tokens"] = FAST_TOKENS
        if "seed" in body:
            body["seed"] = _seed(body["seed"])
        _schema(body)
        _model(body)
    elif path == "/tokenize":
        if "messages" in body:
            body["messages"] = _roles(body["messages"])
        _model(body)
    elif path == "/detokenize":
        if "tokens" in body:
            body["tokens"] = _ids(body["tokens"])
        _model(body)


@schemathesis.hook("map_path_parameters")
def served_model_half_the_time(context, path_parameters):
    if not isinstance(path_parameters, dict):
        return path_parameters
    m = path_parameters.get("model")
    if isinstance(m, str) and zlib.crc32(m.encode("utf-8", "surrogatepass")) % 2 == 0:
        path_parameters["model"] = MODEL
    return path_parameters


# ---- the stream check ------------------------------------------------------

_VALIDATORS = {}


def _event_validator(path):
    """A validator for the JSON payload of one event of `path`'s stream: the
    contentSchema docs/openapi.yaml gives its text/event-stream media type."""
    if path not in _VALIDATORS:
        spec = yaml.safe_load(SPEC.read_text())
        media = spec["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]
        ref = media["schema"]["$ref"].rsplit("/", 1)[1]
        data = spec["components"]["schemas"][ref]["properties"]["data"]["anyOf"]
        content = next(x["contentSchema"] for x in data if "contentSchema" in x)
        root = {"$schema": "https://json-schema.org/draft/2020-12/schema",
                "components": spec["components"], **content}
        _VALIDATORS[path] = jsonschema_rs.validator_for(root)
    return _VALIDATORS[path]


def _header(response, name):
    for k, v in response.headers.items():
        if k.lower() == name:
            return v[0] if isinstance(v, list) else v
    return ""


@schemathesis.check
def sse_events_conform(ctx, response, case):
    if not _header(response, "content-type").startswith("text/event-stream"):
        return None
    text = response.content.decode("utf-8")
    assert text.endswith("\n\n"), f"the stream does not end with a blank line: {text[-200:]!r}"
    blocks = text[:-2].split("\n\n")
    cut_short = getattr(response, "stream_cut_short", False)
    for b in blocks:
        assert re.fullmatch(r"data: [^\n]*", b), f"not one `data:` line: {b[:200]!r}"
    assert cut_short or blocks[-1] == "data: [DONE]", \
        f"the last event is not [DONE]: {blocks[-1][:200]!r}"
    validator = _event_validator(case.operation.path)
    for b in blocks:
        if b == "data: [DONE]":
            assert b is blocks[-1], "an event after [DONE]"
            continue
        payload = json.loads(b[len("data: "):])
        errors = [e.message for e in validator.iter_errors(payload)]
        assert not errors, f"event {b[:300]!r} does not match the spec: {errors[:3]}"
    return True
