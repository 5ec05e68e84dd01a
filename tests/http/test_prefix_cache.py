"""The prefix cache over HTTP: prompts that start with the same whole KV
blocks reuse their K/V (usage.prompt_tokens_details.cached_tokens), and the
output is exactly what the server computes without the cache (same tokens,
same logprobs to the last bit of the JSON float), checked against the golden
continuations of stories260K; cached blocks count as free and are evicted
when the pool needs them; echo with logprobs computes every prompt token;
--no-prefix-caching turns it off; /metrics and /healthz count lookups and
hits.

Each test starts its own dolphind (helpers in dolphin_server.py).
"""
import pytest
import requests

from dolphin_server import Dolphind, golden, parse_sse

BLOCK = 16


@pytest.fixture
def start():
    servers = []

    def _start(model, *args, threads=2):
        s = Dolphind(model, args, threads=threads)
        servers.append(s)
        return s

    yield _start
    for s in servers:
        s.stop()


def cached_of(r):
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def metric(srv, name):
    """The one sample of a family (per-model ones carry a model label)."""
    text = requests.get(srv.url + "/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{model="):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def expect_cached(n_prompt):
    """Whole blocks, never the last prompt token (its logits are computed)."""
    return (n_prompt - 1) // BLOCK * BLOCK


def golden_prompt(case, m):
    """Token-id prompt: the golden prompt (BOS first) and the first m greedy
    tokens; its greedy continuation is greedy_ids[m:]."""
    return case["prompt_ids"] + case["greedy_ids"][:m]


def test_hit_is_exact_and_matches_golden(start):
    """stories260K (F32, exact against the float64 reference): a prompt of
    1 + 40 golden tokens, sent three times. The first computes all 41
    positions; the others take 32 from the cache. All three continue with
    the golden tokens and carry identical logprobs, and a server without the
    cache returns the same bytes."""
    g = golden("stories260K")
    case = max(g["cases"], key=lambda c: len(c["greedy_ids"]))
    m = 40
    prompt = golden_prompt(case, m)
    want = case["greedy_ids"][m:m + 24]
    body = {"prompt": prompt, "max_tokens": len(want), "temperature": 0, "logprobs": 5,
            "return_token_ids": True}
    srv = start("stories260K")
    bodies = []
    for i in range(3):
        r = srv.complete(body)
        assert cached_of(r) == (0 if i == 0 else expect_cached(len(prompt))), r.json()["usage"]
        ch = r.json()["choices"][0]
        assert ch["token_ids"] == want
        bodies.append(ch)
    assert bodies[1] == bodies[0] and bodies[2] == bodies[0]

    off = start("stories260K", "--no-prefix-caching")
    for _ in range(2):
        r = off.complete(body)
        assert cached_of(r) == 0
        assert r.json()["choices"][0] == bodies[0]
    assert metric(off, "dolphin_prefix_cache_hits_total") == 0
    assert metric(off, "dolphin_prefix_cache_queries_total") == 0


def test_shared_prefix_then_different_suffix(start):
    """Two prompts that agree on their first 37 tokens: the second takes the
    two whole blocks inside the common part, no more, and returns the same
    continuation as a server without the cache. A third prompt, sent first,
    has the same tokens in its second block after a different first block:
    it must share nothing, and nothing of it may be taken for theirs."""
    g = golden("stories260K")
    case = max(g["cases"], key=lambda c: len(c["greedy_ids"]))
    a = golden_prompt(case, 36)                       # 37 tokens
    b = golden_prompt(case, 36) + [case["greedy_ids"][40], case["greedy_ids"][41]] * 4
    # position p >= 2 of c holds a's token p: only the first block differs
    c = [case["prompt_ids"][0], (case["greedy_ids"][0] + 1) % 512] + case["greedy_ids"][1:40]
    fresh = start("stories260K", "--no-prefix-caching")
    want = fresh.complete({"prompt": b, "max_tokens": 20, "temperature": 0, "logprobs": 2}).json()
    srv = start("stories260K")
    assert cached_of(srv.complete({"prompt": c, "max_tokens": 2, "temperature": 0})) == 0
    assert cached_of(srv.complete({"prompt": a, "max_tokens": 4, "temperature": 0})) == 0
    for _ in range(2):
        r = srv.complete({"prompt": b, "max_tokens": 20, "temperature": 0, "logprobs": 2})
        assert cached_of(r) == 32
        assert r.json()["choices"] == want["choices"]
    assert cached_of(srv.complete({"prompt": c, "max_tokens": 2, "temperature": 0})) == 32


def test_generated_blocks_are_cached_too(start):
    """A follow-up prompt made of an earlier prompt and its completion (a
    chat's next turn) finds the generated tokens' blocks as well."""
    srv = start("stories260K")
    first = {"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0,
             "return_token_ids": True}
    r = srv.complete(first)
    assert r.status_code == 200, r.text
    body = r.json()
    n_prompt = body["usage"]["prompt_tokens"]
    gen = body["choices"][0]["token_ids"]
    tok = requests.post(srv.url + "/tokenize", json={"prompt": "Once upon a time"}, timeout=30)
    assert tok.status_code == 200, tok.text
    ids = tok.json()["tokens"]
    assert len(ids) == n_prompt
    follow = ids + gen + ids[1:]
    r2 = srv.complete({"prompt": follow, "max_tokens": 8, "temperature": 0})
    # every whole block of what the first request computed is found: its
    # prompt and completion but the last generated token (never fed back)
    assert cached_of(r2) == (n_prompt + len(gen) - 1) // BLOCK * BLOCK > n_prompt


def test_echo_logprobs_computes_every_prompt_token(start):
    """echo + logprobs needs each prompt token's logprob: no cache lookup,
    and the prompt logprobs equal those of a first, uncached request."""
    srv = start("stories260K")
    g = golden("stories260K")
    case = max(g["cases"], key=lambda c: len(c["greedy_ids"]))
    prompt = golden_prompt(case, 40)
    body = {"prompt": prompt, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 1}
    r1 = srv.complete(body)
    assert r1.status_code == 200, r1.text
    assert cached_of(srv.complete({"prompt": prompt, "max_tokens": 1, "temperature": 0})) == 32
    r2 = srv.complete(body)
    assert cached_of(r2) == 0
    lp1, lp2 = r1.json()["choices"][0]["logprobs"], r2.json()["choices"][0]["logprobs"]
    assert len(lp2["token_logprobs"]) == len(prompt) + 3
    assert lp2 == lp1


def test_n_and_stream_with_a_hit(start):
    """n = 3 greedy choices forked from a cached prompt are identical to one
    another and to the uncached answer; the streamed usage chunk reports the
    cached tokens."""
    srv = start("stories260K")
    g = golden("stories260K")
    case = max(g["cases"], key=lambda c: len(c["greedy_ids"]))
    prompt = golden_prompt(case, 50)
    want = case["greedy_ids"][50:62]
    r = srv.complete({"prompt": prompt, "max_tokens": 12, "temperature": 0,
                      "return_token_ids": True})
    assert cached_of(r) == 0 and r.json()["choices"][0]["token_ids"] == want
    r = srv.complete({"prompt": prompt, "max_tokens": 12, "temperature": 0, "n": 3,
                      "return_token_ids": True})
    assert cached_of(r) == 48
    assert [c["token_ids"] for c in r.json()["choices"]] == [want] * 3
    r = srv.complete({"prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": True,
                      "stream_options": {"include_usage": True}}, stream=True)
    assert r.status_code == 200, r.text
    events, done = parse_sse(r.text)
    assert done
    assert events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 48
    srv.wait_idle()


def test_cached_blocks_are_free_and_evicted_when_needed(start):
    """A 16-block pool: after a request ends, its cached blocks count as free
    (blocks_used 0, blocks_cached > 0); a request that needs the whole pool
    evicts them and is right; the evicted prompt then finds only what the big
    request cached in their place."""
    srv = start("stories260K", "--kv-cache-tokens", "256", "--kv-block-size", "16")
    g = golden("stories260K")
    case = max(g["cases"], key=lambda c: len(c["greedy_ids"]))
    prompt = golden_prompt(case, 40)
    before = srv.wait_idle()["kv_cache"]["blocks_cached"]   # the warm-up's prompt blocks
    hits0 = metric(srv, "dolphin_prefix_cache_hits_total")
    r = srv.complete({"prompt": prompt, "max_tokens": 8, "temperature": 0})
    assert cached_of(r) == 0
    h = srv.wait_idle()
    assert h["kv_cache"]["blocks_used"] == 0
    # 41 + 7 positions computed: 3 whole blocks more
    assert h["kv_cache"]["blocks_cached"] == before + 3
    assert metric(srv, "dolphin_kv_cache_blocks_cached") == before + 3
    assert metric(srv, "dolphin_kv_cache_blocks_used") == 0

    # 1 + 250 tokens: all 16 blocks, so the three cached ones are evicted
    big = {"prompt": case["prompt_ids"], "max_tokens": 250, "temperature": 0,
           "return_token_ids": True}
    r = srv.complete(big)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == case["greedy_ids"][:250]
    srv.wait_idle()
    # the big request's own prompt is one token: nothing of it to cache, but
    # its generated blocks are; the 41-token prompt's first block is gone
    r = srv.complete({"prompt": prompt, "max_tokens": 8, "temperature": 0,
                      "return_token_ids": True})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == case["greedy_ids"][40:48]
    # its first 32 tokens are also the big request's first 32 tokens (prompt
    # + golden continuation), whose blocks the big request cached
    assert cached_of(r) == 32
    q, hits = (metric(srv, "dolphin_prefix_cache_queries_total"),
               metric(srv, "dolphin_prefix_cache_hits_total"))
    assert hits - hits0 == 32 and q >= 41 + 1 + 41
    srv.wait_idle()
