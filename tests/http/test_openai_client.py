"""Dolphin through the official `openai` Python package, as applications use
it: models, completions and chat completions (whole and streamed), n > 1,
several prompts, stop strings, logprobs, echo, stream_options.include_usage,
seeds, raw responses and their headers, every error class the client maps
(BadRequest, Authentication, NotFound, RateLimit with the client's own retry
honouring Retry-After), client-side timeouts that cancel a generation, and
no 5xx at all.

Every parsed response is checked against the client's typed models: it
validates strictly (not just `construct`), serialises without warnings, and
carries no field the models lack except Dolphin's documented extensions.
"""
import asyncio
import re
import threading
import time
import warnings

import httpx2
import openai
import pydantic
import pytest
import requests
from openai import (APITimeoutError, AsyncOpenAI, AuthenticationError, BadRequestError,
                    NotFoundError, OpenAI, RateLimitError)

from dolphin_server import Dolphind

MODEL = "stories260K"
API_KEY = "client-test-key-0123456789"
LONG_TOKENS = 1000   # tiny-llama2 (context 1024): seconds of generation on one thread

# Fields Dolphin adds to OpenAI's objects (docs/api.md, docs/openapi.yaml).
EXTENSIONS = {"max_model_len", "prompt_token_ids", "token_ids", "dolphin"}


# ---- servers ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def srv():
    s = Dolphind(MODEL)
    yield s
    assert_no_5xx(s)
    s.stop()


@pytest.fixture(scope="module")
def small():
    """An API key, one sequence at a time and a queue of one, on tiny-llama2
    with one thread, so that a long request keeps the slot busy for seconds."""
    s = Dolphind("tiny-llama2", ["--max-batch-size", "1", "--max-queue", "1",
                                 "--batch-window-ms", "0", "--api-key", API_KEY],
                 threads=1, api_key=API_KEY)
    yield s
    assert_no_5xx(s)
    s.stop()


@pytest.fixture(scope="module")
def client(srv):
    return OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def metrics(s):
    """The unlabelled (or only model-labelled) samples and the per-status request counts of /metrics
    (probes left out: /healthz is 503 while the server warms up)."""
    text = requests.get(s.url + "/metrics", timeout=30).text
    plain, by_status = {}, {}
    for line in text.splitlines():
        m = re.match(r'^(dolphin_[a-z_]+)(?:\{model="[^"]*"\})? (\S+)$', line)
        if m:
            plain[m.group(1)] = float(m.group(2))
        m = re.match(r'^dolphin_requests_total\{.*status="(\d+)".*\} (\S+)$', line)
        if m and 'route="/healthz"' not in line:
            by_status[int(m.group(1))] = by_status.get(int(m.group(1)), 0) + float(m.group(2))
    return plain, by_status


def assert_no_5xx(s):
    _, by_status = metrics(s)
    assert not any(code >= 500 for code in by_status), f"5xx answers: {by_status}"


def wait_freed(s, timeout=10):
    """Poll /metrics until no sequence runs and no KV block is in use."""
    deadline = time.monotonic() + timeout
    while True:
        m, _ = metrics(s)
        if m["dolphin_running_sequences"] == 0 and m["dolphin_kv_cache_blocks_used"] == 0:
            return m
        assert time.monotonic() < deadline, f"sequence not freed within {timeout} s: {m}"
        time.sleep(0.02)


# ---- the typed models -------------------------------------------------------------

def extras(obj, path="$"):
    """Every field of obj (recursively) that its typed model does not declare."""
    out = set()
    if isinstance(obj, pydantic.BaseModel):
        for k in (obj.model_extra or {}):
            out.add(f"{path}.{k}")
        for k in type(obj).model_fields:
            out |= extras(getattr(obj, k), f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out |= extras(v, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out |= extras(v, f"{path}.{k}")
    return out


def typed(obj, strict=True):
    """Check a parsed response against its typed model and return it."""
    raw = obj.model_dump(mode="json", exclude_unset=True, warnings="error")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if strict:   # strict validation, not the lenient construct
            type(obj).model_validate(raw)
        obj.to_json()
    unknown = {p for p in extras(obj) if p.rsplit(".", 1)[-1] not in EXTENSIONS}
    assert not unknown, f"fields the client's models lack: {sorted(unknown)}"
    return obj


def collect(stream):
    """All chunks of a stream, each checked against its typed model. The
    client types a legacy completions chunk as a whole `Completion`, whose
    finish_reason is not nullable, though OpenAI's own streams send null
    until the last chunk: those chunks get every check but the strict one."""
    return [typed(c, strict=not isinstance(c, openai.types.Completion)) for c in stream]


# ---- models ------------------------------------------------------------------------

def test_models_list_and_retrieve(client):
    lst = client.models.list()
    assert [typed(m).id for m in lst.data] == [MODEL]
    m = typed(client.models.retrieve(MODEL))
    assert (m.id, m.object) == (MODEL, "model")
    assert m.model_extra["max_model_len"] > 0


# ---- completions -------------------------------------------------------------------

def test_completion_whole_and_streamed_agree(client):
    params = dict(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0)
    whole = typed(client.completions.create(**params))
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert len(whole.choices) == 1 and whole.choices[0].text
    assert whole.choices[0].finish_reason in ("stop", "length")
    u = whole.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens

    chunks = collect(client.completions.create(**params, stream=True,
                                               stream_options={"include_usage": True}))
    assert "".join(c.text for ch in chunks for c in ch.choices) == whole.choices[0].text
    usage = [ch.usage for ch in chunks if ch.usage]
    assert len(usage) == 1 and chunks[-1].usage is not None and chunks[-1].choices == []
    assert (usage[0].prompt_tokens, usage[0].completion_tokens) == \
        (u.prompt_tokens, u.completion_tokens)
    # without include_usage no chunk carries usage
    plain = collect(client.completions.create(**params, stream=True))
    assert all(ch.usage is None for ch in plain)
    assert [c.finish_reason for ch in plain for c in ch.choices if c.finish_reason] == \
        [whole.choices[0].finish_reason]


def test_completion_n3_sampled_indexes_and_seed(client):
    params = dict(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=1, n=3,
                  seed=7)
    a = typed(client.completions.create(**params))
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert len({c.text for c in a.choices}) > 1
    b = typed(client.completions.create(**params))
    assert [c.text for c in b.choices] == [c.text for c in a.choices]
    texts = ["", "", ""]
    for ch in collect(client.completions.create(**params, stream=True)):
        for c in ch.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in a.choices]


def test_completion_several_prompts(client, srv):
    r = typed(client.completions.create(model=MODEL, prompt=["The cat", "Lily and Tom"], n=2,
                                        max_tokens=8, temperature=0))
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text
    assert r.choices[2].text == r.choices[3].text
    # token-id prompts give the same text as the strings they encode
    ids = requests.post(srv.url + "/tokenize", json={"prompt": "The cat"},
                        timeout=30).json()["tokens"]
    t = typed(client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0))
    assert t.choices[0].text == r.choices[0].text


def test_completion_stop_cuts_exactly_also_streamed(client):
    base = dict(model=MODEL, prompt="Once upon a time", max_tokens=48, temperature=0)
    full = typed(client.completions.create(**base)).choices[0].text
    stop = full[10:14]
    cut = full.index(stop)
    r = typed(client.completions.create(**base, stop=[stop, "zzz"]))
    assert r.choices[0].text == full[:cut]
    assert r.choices[0].finish_reason == "stop"
    text = "".join(c.text for ch in collect(client.completions.create(**base, stop=stop,
                                                                      stream=True))
                   for c in ch.choices)
    assert text == full[:cut]


def test_completion_logprobs_and_echo(client):
    # the client types token_logprobs as floats and top_logprobs as dicts, yet
    # with echo OpenAI itself sends null for the first token: not strict here
    r = typed(client.completions.create(model=MODEL, prompt="The cat", max_tokens=5,
                                        temperature=0, logprobs=2, echo=True,
                                        extra_body={"ignore_eos": True}), strict=False)
    lp = r.choices[0].logprobs
    n = r.usage.prompt_tokens + 5
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert len(getattr(lp, key)) == n, key
    assert lp.token_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert all(len(t) == 2 for t in lp.top_logprobs[1:])
    assert r.choices[0].text.startswith("The cat")
    # the pieces keep the first word's space, which the text drops (docs/api.md)
    assert "".join(lp.tokens).removeprefix(" ") == r.choices[0].text
    # streamed: the same tokens and log-probabilities, the prompt first
    chunks = collect(client.completions.create(model=MODEL, prompt="The cat", max_tokens=5,
                                               temperature=0, logprobs=2, echo=True,
                                               stream=True, extra_body={"ignore_eos": True}))
    toks = [t for ch in chunks for c in ch.choices if c.logprobs for t in c.logprobs.tokens]
    assert toks == lp.tokens


def test_completion_extensions_return_token_ids(client):
    r = typed(client.completions.create(model=MODEL, prompt="The cat", max_tokens=4,
                                        temperature=0,
                                        extra_body={"return_token_ids": True,
                                                    "ignore_eos": True}))
    c = r.choices[0]
    assert c.model_extra["prompt_token_ids"][0] == 1           # BOS
    assert len(c.model_extra["token_ids"]) == 4


def test_raw_response_headers(client):
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="Hello", max_tokens=2, extra_headers={"X-Request-Id": "client-rid-1"})
    assert raw.status_code == 200
    assert raw.headers["x-request-id"] == "client-rid-1"
    assert raw.headers["content-type"].startswith("application/json")
    typed(raw.parse())
    # a fresh id when the client sends none (the SDK's own request ids aside)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert re.fullmatch(r"[0-9a-f]{32}", raw.headers["x-request-id"])
    typed(raw.parse())
    # streamed, the headers arrive before the events
    with client.completions.with_streaming_response.create(
            model=MODEL, prompt="Hello", max_tokens=4, stream=True,
            extra_headers={"X-Request-Id": "client-rid-2"}) as resp:
        assert resp.headers["x-request-id"] == "client-rid-2"
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["cache-control"] == "no-cache"
        body = "".join(resp.iter_text())
    assert body.endswith("data: [DONE]\n\n")


# ---- chat --------------------------------------------------------------------------

CHAT = [{"role": "system", "content": "Tell a story."},
        {"role": "user", "content": "Once upon a time"}]


def test_chat_whole_and_streamed_agree(client):
    params = dict(model=MODEL, messages=CHAT, max_tokens=24, temperature=0)
    whole = typed(client.chat.completions.create(**params))
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    msg = whole.choices[0].message
    assert msg.role == "assistant" and msg.content

    chunks = collect(client.chat.completions.create(**params, stream=True,
                                                    stream_options={"include_usage": True}))
    deltas = [c for ch in chunks for c in ch.choices]
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert deltas[0].delta.role == "assistant"
    assert "".join(c.delta.content or "" for c in deltas) == msg.content
    assert [c.finish_reason for c in deltas if c.finish_reason] == \
        [whole.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == \
        (whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens)
    # the streamed request came second: its prompt's whole 16-token blocks
    # (all but the last token) came from the prefix cache
    assert usage.prompt_tokens_details.cached_tokens == (usage.prompt_tokens - 1) // 16 * 16


def test_chat_n2_stop_logprobs(client):
    messages = [{"role": "user", "content": "Once upon a time"}]
    r = typed(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                             temperature=1, n=2, seed=3))
    assert [c.index for c in r.choices] == [0, 1]
    texts = ["", ""]
    for ch in collect(client.chat.completions.create(model=MODEL, messages=messages,
                                                     max_tokens=12, temperature=1, n=2,
                                                     seed=3, stream=True)):
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == [c.message.content for c in r.choices]

    full = typed(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32,
                                                temperature=0)).choices[0].message.content
    stop = full[6:9]
    s = typed(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32,
                                             temperature=0, stop=stop))
    assert s.choices[0].message.content == full[:full.index(stop)]
    assert s.choices[0].finish_reason == "stop"

    lp = typed(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4,
                                              temperature=0, logprobs=True, top_logprobs=2,
                                              extra_body={"ignore_eos": True}))
    content = lp.choices[0].logprobs.content
    assert len(content) == 4
    assert "".join(t.token for t in content) == lp.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 2
        assert t.bytes == list(t.token.encode())


# ---- errors ------------------------------------------------------------------------

def test_bad_request(client):
    with pytest.raises(BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", temperature=5)
    assert e.value.status_code == 400 and e.value.param == "temperature"
    assert e.value.type == "invalid_request_error"
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.create(model=MODEL,
                                       messages=[{"role": "assistant", "content": "x"}])
    assert e.value.param == "messages"
    with pytest.raises(BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", suffix="y")
    assert e.value.param == "suffix"
    with pytest.raises(BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=100000)
    assert e.value.code == "context_length_exceeded"
    # a stream is validated completely before any event
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       stream=True, logprobs=True, top_logprobs=9)
    assert e.value.param == "top_logprobs"
    assert e.value.response.headers["x-request-id"]


def test_not_found(client):
    with pytest.raises(NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="x")
    assert e.value.status_code == 404 and e.value.code == "model_not_found"
    with pytest.raises(NotFoundError):
        client.models.retrieve("gpt-4")


def test_authentication(small):
    bad = OpenAI(base_url=small.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(AuthenticationError) as e:
        bad.chat.completions.create(model="tiny-llama2",
                                    messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    good = OpenAI(base_url=small.url + "/v1", api_key=API_KEY, max_retries=0)
    r = typed(good.completions.create(model="tiny-llama2", prompt="x", max_tokens=2))
    assert len(r.choices) == 1


def occupy(s, max_tokens):
    """Fill `small`: one long request running, one queued. Returns the two
    threads (each posts a request and keeps its status)."""
    out = []

    def post(body):
        out.append(s.complete(body).status_code)

    body = {"prompt": "Hello", "max_tokens": max_tokens, "temperature": 1.0, "seed": 5,
            "ignore_eos": True}
    a = threading.Thread(target=post, args=(body,), daemon=True)
    a.start()
    s.wait_for(lambda h: h["scheduler"]["running_seqs"] == 1, 30, "the long request to run")
    b = threading.Thread(target=post, args=({**body, "max_tokens": 8},), daemon=True)
    b.start()
    s.wait_for(lambda h: h["scheduler"]["queued"] == 1, 30, "the second request to queue")
    return [a, b], out


def test_rate_limit_without_retry(small):
    threads, out = occupy(small, 400)
    c = OpenAI(base_url=small.url + "/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(RateLimitError) as e:
        c.completions.create(model="tiny-llama2", prompt="Hello", max_tokens=2)
    assert e.value.status_code == 429
    assert int(e.value.response.headers["retry-after"]) >= 1
    for t in threads:
        t.join(300)
    assert out == [200, 200]
    small.wait_idle()


def test_rate_limit_client_retries_after_retry_after(small):
    """The client's own retry: a 429 with Retry-After: 1 is retried after
    that second (the client's default back-off alone would wait 0.5 s at
    most), until the queue has room."""
    attempts = []
    hooks = {"response": [lambda r: attempts.append((time.monotonic(), r.status_code,
                                                     r.headers.get("retry-after")))]}
    c = OpenAI(base_url=small.url + "/v1", api_key=API_KEY, max_retries=8,
               http_client=httpx2.Client(event_hooks=hooks))
    threads, out = occupy(small, 150)
    r = typed(c.completions.create(model="tiny-llama2", prompt="Hello", max_tokens=2))
    assert len(r.choices) == 1
    for t in threads:
        t.join(300)
    statuses = [a[1] for a in attempts]
    assert statuses[0] == 429 and statuses[-1] == 200 and set(statuses[:-1]) == {429}, attempts
    for (t0, _, ra), (t1, _, _) in zip(attempts, attempts[1:]):
        assert ra == "1"
        assert t1 - t0 >= 0.95, f"retried {t1 - t0:.3f} s after a Retry-After of 1 s"
    print(f"{len(attempts)} attempts, gaps "
          f"{[round(b[0] - a[0], 2) for a, b in zip(attempts, attempts[1:])]} s")
    small.wait_idle()


# ---- client-side timeouts ----------------------------------------------------------

def long_params(**kw):
    return dict(model="tiny-llama2", prompt="Hello", max_tokens=LONG_TOKENS, temperature=1.0,
                seed=11, extra_body={"ignore_eos": True}, **kw)


def test_timeout_cancels_whole_request(small):
    """The client's timeout fires while the server is generating: the
    server notices the closed connection and frees the sequence."""
    steps0 = small.sched()[0]["steps"]
    c = OpenAI(base_url=small.url + "/v1", api_key=API_KEY, max_retries=0, timeout=0.2)
    with pytest.raises(APITimeoutError):   # 1000 tokens with 5 logprobs each: ~1 s
        c.completions.create(**long_params(logprobs=5))
    wait_freed(small)
    steps = small.sched()[0]["steps"] - steps0
    assert steps < LONG_TOKENS * 0.9, f"{steps} steps: the request ran to its end"
    small.wait_idle()


def test_timeout_cancels_stream_midway(small):
    """An application deadline (asyncio) around an AsyncOpenAI stream: it
    expires after some chunks have arrived; the stream is closed, and
    /metrics soon shows no running sequence and no KV block in use."""
    steps0 = small.sched()[0]["steps"]

    async def run():
        c = AsyncOpenAI(base_url=small.url + "/v1", api_key=API_KEY, max_retries=0)
        got = 0
        try:
            async with asyncio.timeout(60) as deadline:
                stream = await c.completions.create(**long_params(stream=True))
                async for chunk in stream:
                    typed(chunk, strict=False)
                    got += 1
                    if got == 3:
                        deadline.reschedule(asyncio.get_running_loop().time() + 0.3)
        except TimeoutError:
            pass
        finally:
            await c.close()
        return got

    got = asyncio.run(run())
    assert 3 <= got < LONG_TOKENS, got
    m = wait_freed(small)
    assert m["dolphin_inflight_requests"] <= 1   # this scrape itself
    steps = small.sched()[0]["steps"] - steps0
    assert steps < LONG_TOKENS * 0.9, f"{steps} steps: the stream ran to its end"
    small.wait_idle()

