"""/v1/completions features beyond one greedy prompt: n, several prompts,
stop strings (streamed and not), echo, logprobs, seeds, max_tokens
defaults, and literal special-token text."""
import math

import pytest
import requests

from dolphin_server import parse_sse, stream_texts


def _stream(server, body):
    with requests.post(server.url + "/v1/completions", json=dict(body, stream=True),
                       stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        events, done = parse_sse(r)
    assert done
    return events


def test_n_choices_greedy(server, stories_golden):
    case = stories_golden["cases"][3]
    r = server.complete({"prompt": case["prompt"], "max_tokens": case["max_tokens"],
                         "temperature": 0, "n": 3})
    assert r.status_code == 200
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["text"] == case["greedy_text"] for c in body["choices"])
    assert body["usage"]["completion_tokens"] == 3 * len(case["greedy_ids"])
    assert body["usage"]["prompt_tokens"] == len(case["prompt_ids"])


def test_n_choices_sampled_differ_and_stream(server):
    body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 1.0, "n": 4,
            "seed": 7}
    whole = server.complete(body).json()
    texts = [c["text"] for c in whole["choices"]]
    assert len(set(texts)) > 1, texts
    events = _stream(server, body)
    assert stream_texts(events, 4) == texts
    finishes = {ch["index"]: ch["finish_reason"] for ev in events for ch in ev["choices"]
                if ch["finish_reason"]}
    assert finishes == {c["index"]: c["finish_reason"] for c in whole["choices"]}


def test_multiple_prompts(server, stories_golden):
    cases = stories_golden["cases"][1:4]
    body = {"prompt": [c["prompt"] for c in cases], "max_tokens": 32, "temperature": 0, "n": 2}
    r = server.complete(body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == list(range(6))
    for i, c in enumerate(cases):
        solo = server.complete({"prompt": c["prompt"], "max_tokens": 32,
                                "temperature": 0}).json()["choices"][0]["text"]
        assert choices[2 * i]["text"] == solo == choices[2 * i + 1]["text"]
        assert c["greedy_text"].startswith(solo)
    assert r.json()["usage"]["prompt_tokens"] == sum(len(c["prompt_ids"]) for c in cases)
    events = _stream(server, body)
    assert stream_texts(events, 6) == [c["text"] for c in choices]


def test_multiple_token_prompts(server, stories_golden):
    cases = stories_golden["cases"][1:3]
    r = server.complete({"prompt": [c["prompt_ids"] for c in cases], "max_tokens": 16,
                         "temperature": 0})
    assert r.status_code == 200
    for c, ch in zip(cases, r.json()["choices"]):
        assert c["greedy_text"].startswith(ch["text"])


@pytest.mark.parametrize("stop", ["Lily", ["Lily"], ["zzz", "little girl"], " named"])
def test_stop_strings(server, stories_golden, stop):
    case = stories_golden["cases"][1]   # ", there was a little girl named Lily. ..."
    full = case["greedy_text"]
    stops = [stop] if isinstance(stop, str) else stop
    cut = min(full.find(s) for s in stops if s in full)
    body = {"prompt": case["prompt"], "max_tokens": case["max_tokens"], "temperature": 0,
            "stop": stop}
    r = server.complete(body)
    assert r.status_code == 200
    ch = r.json()["choices"][0]
    assert ch["text"] == full[:cut]
    assert ch["finish_reason"] == "stop"
    events = _stream(server, body)
    assert stream_texts(events) == [full[:cut]]
    for ev in events:
        for c in ev["choices"]:
            assert not any(s in c["text"] for s in stops)


def test_echo(server, stories_golden):
    case = stories_golden["cases"][3]
    body = {"prompt": case["prompt"], "max_tokens": 8, "temperature": 0}
    plain = server.complete(body).json()["choices"][0]["text"]
    echoed = server.complete(dict(body, echo=True)).json()["choices"][0]["text"]
    assert echoed == case["prompt"] + plain
    assert stream_texts(_stream(server, dict(body, echo=True))) == [echoed]


def test_echo_max_tokens_zero(server):
    r = server.complete({"prompt": "The cat", "max_tokens": 0, "echo": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["text"] == "The cat"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 0


def test_logprobs(server):
    r = server.complete({"prompt": "The cat", "max_tokens": 6, "temperature": 0, "logprobs": 3})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    lp = ch["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6
    assert "".join(lp["tokens"]) == ch["text"]
    for tok, val, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert val <= 0
        assert 1 <= len(top) <= 3
        # greedy: the chosen token is the most likely one
        assert math.isclose(val, max(top.values()), rel_tol=1e-5, abs_tol=1e-6)
    assert lp["text_offset"] == sorted(lp["text_offset"])
    # streamed logprobs line up with the streamed text
    events = _stream(server, {"prompt": "The cat", "max_tokens": 6, "temperature": 0,
                              "logprobs": 3})
    toks = [t for ev in events for c in ev["choices"] if c["logprobs"]
            for t in c["logprobs"]["tokens"]]
    assert toks == lp["tokens"]


def test_seed_reproducible(server):
    body = {"prompt": "Once upon a time", "max_tokens": 32, "temperature": 1.0, "seed": 1234}
    a = server.complete(body).json()["choices"][0]["text"]
    b = server.complete(body).json()["choices"][0]["text"]
    assert a == b
    others = {server.complete(dict(body, seed=s)).json()["choices"][0]["text"]
              for s in (1, 2, 3, -5, 2**63 + 11)}
    assert len(others | {a}) > 1


def test_max_tokens_default(server):
    r = server.complete({"prompt": "", "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 16
    r = server.complete({"prompt": "", "temperature": 0, "ignore_eos": True,
                         "max_tokens": None})
    assert r.json()["usage"]["completion_tokens"] == 16


def test_special_token_text_is_literal(server):
    r = server.complete({"prompt": "<s></s>", "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200
    # BOS once, then the characters of "<s></s>" as text (not 2 control ids)
    assert r.json()["usage"]["prompt_tokens"] > 3


def test_empty_prompt_has_no_leading_space(server, stories_golden):
    case = stories_golden["cases"][0]
    assert case["prompt"] == ""
    text = server.complete({"prompt": "", "max_tokens": 4, "temperature": 0}).json()[
        "choices"][0]["text"]
    assert not text.startswith(" ")
    assert case["greedy_text"].startswith(text)


def test_sampling_knobs_accepted(server):
    r = server.complete({"prompt": "The cat", "max_tokens": 8, "temperature": 0.8, "top_p": 0.5,
                         "top_k": 5, "min_p": 0.05, "presence_penalty": 0.5,
                         "frequency_penalty": 0.5, "repetition_penalty": 1.1,
                         "logit_bias": {"13": -100}, "seed": 3, "user": "someone",
                         "best_of": 1})
    assert r.status_code == 200, r.text
