"""Configurable request limits (docs/robustness.md): every one at
its default on the shared stories260K server, and lowered by flags on a
server of its own. A request past a limit gets a 400 OpenAI-shaped error
whose param names the field and whose message names the limit (its value
and its setting). A bad limit setting stops dolphind with exit status 2.

Also the megabyte prompt: tokenizing runs on libmicrohttpd's one thread and
takes seconds for 1 MiB of text, so a text prompt that can never fit is
refused from its length before it is tokenized (dol_tokenizer_min_tokens):
the 400 comes at once and /livez keeps answering meanwhile."""
import json
import subprocess
import threading
import time

import pytest
import requests

from dolphin_server import BIN, check_error, Dolphind

# Flags of the lowered server, and its values.
LOW = ["--max-json-depth", "8", "--max-prompt-tokens", "100", "--max-tokens-cap", "20",
       "--max-n", "2", "--max-stop", "1", "--max-stop-len", "8", "--max-logit-bias", "2",
       "--max-tokens", "50", "--max-body-bytes", "4MiB"]

PROSE = "Once upon a time, there was a little girl named Lily. She liked to play outside. "
MIB = 1 << 20
FAST_S = 1.0       # a refusal from the length alone takes milliseconds; 1 s is slack
                   # for a loaded machine (tokenizing 1 MiB takes 2-4 s)


@pytest.fixture(scope="module")
def low():
    srv = Dolphind("stories260K", LOW)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def big():
    """Defaults, but bodies up to 4 MiB, so that a 1 MiB prompt gets through."""
    srv = Dolphind("stories260K", ["--max-body-bytes", "4MiB"])
    yield srv
    srv.stop()


def raw(srv, path, body: bytes, **kw):
    kw.setdefault("timeout", 120)
    return requests.post(srv.url + path, data=body,
                         headers={"Content-Type": "application/json"}, **kw)


def nested(depth, route="/v1/completions"):
    """A valid body whose objects and arrays nest `depth` deep (the body's
    object is level 1); the nesting sits in an unknown (ignored) field."""
    head = {"/v1/completions": b'{"prompt": "Once", "max_tokens": 1, "x": ',
            "/v1/chat/completions": b'{"messages": [{"role": "user", "content": "Hi"}], '
                                    b'"max_tokens": 1, "x": ',
            "/tokenize": b'{"prompt": "Once", "x": '}[route]
    # strings full of brackets and escaped quotes do not count
    return head + b"[" * (depth - 1) + b'"[[{{\\"[["' + b"]" * (depth - 1) + b"}"


def ok(r):
    assert r.status_code == 200, r.text[:400]
    return r.json()


def names_limit(err, *words):
    for w in words:
        assert w in err["message"], (w, err)


def chat(srv, body):
    return srv.post("/v1/chat/completions", body)


USER = [{"role": "user", "content": "Tell me a story."}]


# ---- max_json_depth ------------------------------------------------------------

@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_json_depth_default(server, route):
    ok(raw(server, route, nested(64, route)))
    err = check_error(raw(server, route, nested(65, route)), 400)
    assert err["type"] == "invalid_request_error" and err["param"] is None
    names_limit(err, "max_json_depth", "64")


def test_json_depth_lowered(low):
    ok(raw(low, "/v1/completions", nested(8)))
    err = check_error(raw(low, "/v1/completions", nested(9)), 400)
    names_limit(err, "max_json_depth", "8")
    # far past cJSON's own limit (1000): still a plain 400
    deep = b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    names_limit(check_error(raw(low, "/v1/completions", deep), 400), "max_json_depth")


# ---- max_prompt_tokens -----------------------------------------------------------

def test_prompt_tokens_default_is_the_context(server):
    # stories260K: 512 positions; a 511-token prompt leaves room for one more
    ok(server.complete({"prompt": [1] + [300] * 510, "max_tokens": 1}))
    err = check_error(server.complete({"prompt": [1] + [300] * 512, "max_tokens": 1}),
                             400, "prompt", "context_length_exceeded")
    assert "512" in err["message"] and "max_prompt_tokens" not in err["message"]


def test_prompt_tokens_lowered(low):
    ok(low.complete({"prompt": [1] + [300] * 99, "max_tokens": 1}))
    err = check_error(low.complete({"prompt": [1] + [300] * 100, "max_tokens": 1}),
                             400, "prompt", "context_length_exceeded")
    names_limit(err, "max_prompt_tokens", "100", "101")
    # a text prompt, counted after tokenizing (too short for the bound)
    text = "Once upon a time " * 40
    n = len(low.post("/tokenize", {"prompt": text}).json()["tokens"])
    assert n > 100
    err = check_error(low.complete({"prompt": text, "max_tokens": 1}), 400, "prompt",
                             "context_length_exceeded")
    names_limit(err, "max_prompt_tokens", str(n))
    # one prompt of several too long: the whole request is refused
    err = check_error(low.complete({"prompt": ["Once", text], "max_tokens": 1}), 400,
                             "prompt", "context_length_exceeded")
    # chat: the conversation in the chat format
    err = check_error(chat(low, {"messages": [{"role": "user", "content": text}]}), 400,
                             "messages", "context_length_exceeded")
    names_limit(err, "max_prompt_tokens")
    ok(chat(low, {"messages": USER, "max_tokens": 2}))


# ---- max_tokens_cap ----------------------------------------------------------------

def test_max_tokens_cap_default_is_the_context(server):
    err = check_error(server.complete({"prompt": "Once", "max_tokens": 600}), 400,
                             "max_tokens", "context_length_exceeded")
    assert "max_tokens_cap" not in err["message"]


def test_max_tokens_cap_lowered(low):
    r = ok(low.complete({"prompt": "Once", "max_tokens": 20, "ignore_eos": True}))
    assert r["usage"]["completion_tokens"] == 20
    err = check_error(low.complete({"prompt": "Once", "max_tokens": 21}), 400,
                             "max_tokens")
    names_limit(err, "max_tokens_cap", "20", "21")
    # the default max_tokens (--max-tokens 50) is held to the cap
    r = ok(low.complete({"prompt": "Once", "ignore_eos": True}))
    assert r["usage"]["completion_tokens"] == 20
    # chat: max_completion_tokens and max_tokens; without either, the cap ends it
    err = check_error(chat(low, {"messages": USER, "max_completion_tokens": 21}), 400,
                             "max_completion_tokens")
    names_limit(err, "max_tokens_cap")
    check_error(chat(low, {"messages": USER, "max_tokens": 21}), 400, "max_tokens")
    r = ok(chat(low, {"messages": USER, "ignore_eos": True}))
    assert r["usage"]["completion_tokens"] == 20
    assert r["choices"][0]["finish_reason"] == "length"


# ---- max_n ------------------------------------------------------------------------------

def test_n_default(server):
    err = check_error(server.complete({"prompt": "Once", "n": 17, "max_tokens": 1}),
                             400, "n")
    names_limit(err, "max_n", "16")
    # max_batch_size (8) still bounds n below max_n
    err = check_error(server.complete({"prompt": "Once", "n": 9, "max_tokens": 1}),
                             400, "n")
    assert "max_batch_size" in err["message"]
    assert len(ok(server.complete({"prompt": "Once", "n": 8, "max_tokens": 1}))["choices"]) == 8


def test_n_lowered(low):
    assert len(ok(low.complete({"prompt": "Once", "n": 2, "max_tokens": 1}))["choices"]) == 2
    err = check_error(low.complete({"prompt": "Once", "n": 3, "max_tokens": 1}), 400, "n")
    names_limit(err, "max_n", "2")
    check_error(low.complete({"prompt": "Once", "n": 2, "best_of": 3, "max_tokens": 1}),
                       400, "best_of")
    check_error(chat(low, {"messages": USER, "n": 3, "max_tokens": 1}), 400, "n")


# ---- max_stop, max_stop_len ------------------------------------------------------------------

def test_stop_default(server):
    base = {"prompt": "Once", "max_tokens": 2}
    ok(server.complete(dict(base, stop=["a", "b", "c", "d"])))
    err = check_error(server.complete(dict(base, stop=["a", "b", "c", "d", "e"])), 400,
                             "stop")
    names_limit(err, "max_stop", "4")
    ok(server.complete(dict(base, stop="x" * 512)))
    err = check_error(server.complete(dict(base, stop=["a", "x" * 513])), 400, "stop")
    names_limit(err, "max_stop_len", "512", "513")
    # bytes, not characters: 171 three-byte characters are 513 bytes
    check_error(server.complete(dict(base, stop="\u63a8" * 171)), 400, "stop")


def test_stop_lowered(low):
    base = {"prompt": "Once", "max_tokens": 2}
    ok(low.complete(dict(base, stop="12345678")))
    ok(low.complete(dict(base, stop=["12345678"])))
    err = check_error(low.complete(dict(base, stop=["a", "b"])), 400, "stop")
    names_limit(err, "max_stop", "1")
    err = check_error(low.complete(dict(base, stop="123456789")), 400, "stop")
    names_limit(err, "max_stop_len", "8", "9")
    check_error(chat(low, {"messages": USER, "stop": ["a", "b"]}), 400, "stop")


# ---- max_logit_bias ---------------------------------------------------------------------------

def test_logit_bias_default(server):
    base = {"prompt": "Once", "max_tokens": 1}
    ok(server.complete(dict(base, logit_bias={str(i): 1 for i in range(300)})))
    err = check_error(server.complete(dict(base, logit_bias={str(i): 1 for i in range(301)})),
                             400, "logit_bias")
    names_limit(err, "max_logit_bias", "300", "301")


def test_logit_bias_lowered(low):
    base = {"prompt": "Once", "max_tokens": 1}
    ok(low.complete(dict(base, logit_bias={"5": 1, "6": -1})))
    err = check_error(low.complete(dict(base, logit_bias={"5": 1, "6": 1, "7": 1})), 400,
                             "logit_bias")
    names_limit(err, "max_logit_bias", "2")
    check_error(chat(low, {"messages": USER, "logit_bias": {"5": 1, "6": 1, "7": 1}}),
                       400, "logit_bias")


# ---- all of them: streaming requests are refused before any event ---------------------------

@pytest.mark.parametrize("body,param", [
    ({"n": 3}, "n"), ({"stop": ["a", "b"]}, "stop"), ({"max_tokens": 21}, "max_tokens"),
    ({"logit_bias": {"5": 1, "6": 1, "7": 1}}, "logit_bias"),
    ({"prompt": [1] + [300] * 100}, "prompt"),
])
def test_stream_refused_before_headers(low, body, param):
    r = low.complete(dict({"prompt": "Once", "max_tokens": 2, "stream": True}, **body))
    check_error(r, 400, param)
    assert not r.headers["Content-Type"].startswith("text/event-stream")


# ---- bad settings ---------------------------------------------------------------------------

@pytest.mark.parametrize("flags,want", [
    (["--max-stop", "5"], "flag --max-stop: out of range: 5 (must be between 1 and 4)"),
    (["--max-logit-bias", "301"], "flag --max-logit-bias: out of range: 301"),
    (["--max-json-depth", "1001"], "flag --max-json-depth: out of range: 1001"),
    (["--max-n", "0"], "flag --max-n: out of range: 0"),
    (["--max-stop-len", "0"], "flag --max-stop-len: out of range: 0"),
    (["--max-prompt-tokens", "-1"], "flag --max-prompt-tokens: out of range: -1"),
    (["--max-tokens-cap", "x"], "flag --max-tokens-cap: not an integer: x"),
])
def test_bad_limit_settings(flags, want):
    if not BIN.is_file():
        pytest.skip(f"{BIN} not built (set DOLPHIN_BIN)")
    p = subprocess.run([str(BIN), *flags], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p
    assert want in p.stderr, p.stderr


# ---- the megabyte prompt ------------------------------------------------------------------------

def megabyte(text=PROSE, size=MIB):
    return (text * (size // len(text) + 1))[:size]


def timed(fn):
    t0 = time.monotonic()
    r = fn()
    return r, time.monotonic() - t0


def test_megabyte_prompt_refused_at_once(big):
    prompt = megabyte()
    assert len(prompt.encode()) == MIB
    r, dt = timed(lambda: big.complete({"prompt": prompt, "max_tokens": 16}))
    err = check_error(r, 400, "prompt", "context_length_exceeded")
    names_limit(err, "512", "without tokenizing")
    assert dt < FAST_S, dt
    # one long prompt among short ones
    r, dt = timed(lambda: big.complete({"prompt": ["Once", prompt], "max_tokens": 1}))
    check_error(r, 400, "prompt", "context_length_exceeded")
    assert dt < FAST_S, dt
    # chat: one long message
    r, dt = timed(lambda: chat(big, {"messages": [{"role": "user", "content": prompt}]}))
    check_error(r, 400, "messages", "context_length_exceeded")
    assert dt < FAST_S, dt


def test_megabyte_prompt_lowered_limit(low):
    r, dt = timed(lambda: low.complete({"prompt": megabyte(), "max_tokens": 1}))
    err = check_error(r, 400, "prompt", "context_length_exceeded")
    names_limit(err, "max_prompt_tokens", "100", "without tokenizing")
    assert dt < FAST_S, dt


def test_megabyte_of_spaces_llama(tiny_server):
    # Llama-2's tokenizer keeps every space (16 to a token at most): just
    # under the default 1 MiB body, still far past 1024 positions.
    prompt = " " * (MIB - 64)
    r, dt = timed(lambda: tiny_server.complete({"prompt": prompt, "max_tokens": 1}))
    check_error(r, 400, "prompt", "context_length_exceeded")
    assert dt < FAST_S, dt
    r, dt = timed(lambda: tiny_server.complete({"prompt": megabyte(size=MIB - 64),
                                                "max_tokens": 1}))
    check_error(r, 400, "prompt", "context_length_exceeded")
    assert dt < FAST_S, dt


def test_prompt_near_the_bound_is_still_counted_exactly(big):
    # Short enough for the bound to let it through (stories260K: at most 7
    # characters a token), long enough not to fit: refused after tokenizing,
    # with the exact count; and one that fits is served.
    prompt = megabyte(size=3000)
    n = big.post("/tokenize", {"prompt": prompt}).json()["count"]
    assert n > 512
    err = check_error(big.complete({"prompt": prompt, "max_tokens": 1}), 400, "prompt",
                             "context_length_exceeded")
    assert str(n) in err["message"] and "without tokenizing" not in err["message"]
    ok(big.complete({"prompt": megabyte(size=1500), "max_tokens": 1}))


def test_livez_stays_fast_during_megabyte_prompts(big):
    body = json.dumps({"prompt": megabyte(), "max_tokens": 16}).encode()
    results, stop = [], threading.Event()

    def hammer():
        with requests.Session() as s:
            while not stop.is_set():
                t0 = time.monotonic()
                r = s.post(big.url + "/v1/completions", data=body,
                           headers={"Content-Type": "application/json"}, timeout=120)
                results.append((r.status_code, time.monotonic() - t0))

    threads = [threading.Thread(target=hammer) for _ in range(2)]
    for t in threads:
        t.start()
    lat = []
    try:
        with requests.Session() as s:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                t0 = time.monotonic()
                r = s.get(big.url + "/livez", timeout=30)
                lat.append(time.monotonic() - t0)
                assert r.status_code == 200
                time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert len(results) >= 2, results
    assert all(code == 400 for code, _ in results), results
    assert max(dt for _, dt in results) < 2 * FAST_S, results
    assert max(lat) < FAST_S, sorted(lat)[-5:]


def test_default_config_file_holds_every_documented_key():
    """configs/dolphin.yaml holds every key of docs/configuration.md's
    settings table (top-level keys; models: entries have their own table)."""
    import re
    from dolphin_server import REPO
    doc = (REPO / "docs" / "configuration.md").read_text()
    table = doc.split("## Settings", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_0-9]+)` \|", table, re.M))
    yaml_keys = set(re.findall(r"^([a-z_0-9]+):", (REPO / "configs" / "dolphin.yaml").read_text(),
                               re.M))
    assert documented, "no keys found in the settings table"
    # models: is the list form of model: (documented with an example there)
    assert documented - yaml_keys - {"models"} == set()
