"""Concurrent requests: all succeed, and greedy (or seeded) answers are the
same as when each request runs alone (batch invariance, per-request RNG)."""
from concurrent.futures import ThreadPoolExecutor

import requests

from dolphin_server import parse_sse, stream_texts

PROMPTS = ["", "Once upon a time", "Lily and Tom went to the park.", "The cat",
           "Tom had a big red", "One day, a little dog", "The sun was", "Sara and Ben"]


def _run(server, body):
    if body.get("stream"):
        with requests.post(server.url + "/v1/completions", json=body, stream=True,
                           timeout=120) as r:
            assert r.status_code == 200, r.text
            events, done = parse_sse(r)
            assert done
            prompts = body["prompt"]
            n_prompts = len(prompts) if isinstance(prompts, list) and prompts and \
                isinstance(prompts[0], (str, list)) else 1
            return stream_texts(events, n_prompts * body.get("n", 1))
    r = server.complete(body)
    assert r.status_code == 200, r.text
    return [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]


def test_eight_concurrent_greedy(server):
    bodies = [{"prompt": p, "max_tokens": 48 + 8 * i, "temperature": 0, "stream": i % 2 == 1}
              for i, p in enumerate(PROMPTS)]
    solo = [_run(server, b) for b in bodies]
    for _ in range(2):
        with ThreadPoolExecutor(len(bodies)) as ex:
            together = list(ex.map(lambda b: _run(server, b), bodies))
        assert together == solo


def test_concurrent_seeded_sampling(server):
    bodies = [{"prompt": p, "max_tokens": 32, "temperature": 1.0, "top_p": 0.9, "seed": 1000 + i}
              for i, p in enumerate(PROMPTS)]
    solo = [_run(server, b) for b in bodies]
    with ThreadPoolExecutor(len(bodies)) as ex:
        together = list(ex.map(lambda b: _run(server, b), bodies))
    assert together == solo


def test_concurrent_mixed_load(server):
    """More requests than the batch holds, with n > 1, multiple prompts and
    streaming mixed in: every one completes."""
    bodies = []
    for i in range(24):
        b = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 8 + i, "temperature": 0.7,
             "seed": i, "stream": i % 3 == 0}
        if i % 4 == 1:
            b["n"] = 3
        if i % 5 == 2:
            b["prompt"] = [PROMPTS[1], PROMPTS[3]]
        bodies.append(b)
    with ThreadPoolExecutor(12) as ex:
        results = list(ex.map(lambda b: _run(server, b), bodies))
    for b, res in zip(bodies, results):
        n_prompts = len(b["prompt"]) if isinstance(b["prompt"], list) else 1
        assert len(res) == n_prompts * b.get("n", 1)
        assert all(isinstance(t, str) for t in res)
