"""/v1/completions in full: choices indexed across prompts x n, stop strings
that span tokens (cut exactly, never streamed in part), logprobs 0-5 with
text offsets, echo with the prompt's logprobs, seeds, return_token_ids,
sampling knobs that must have an effect, and the fields refused by name."""
import math

import pytest
import requests

from dolphin_server import check_error, parse_sse, stream_texts


def stream(srv, body):
    with requests.post(srv.url + "/v1/completions", json=dict(body, stream=True),
                       stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        events, done = parse_sse(r)
    assert done
    return events


def texts(resp):
    assert resp.status_code == 200, resp.text
    return [c["text"] for c in resp.json()["choices"]]


def test_choices_indexed_across_prompts_and_n(server):
    """Choice i of prompt p is p*n+i, sampled with seed + p*n + i: each one
    equals the single-choice request with that seed."""
    prompts = ["Once upon a time", "The cat", "Lily and Tom"]
    body = {"prompt": prompts, "n": 2, "max_tokens": 12, "temperature": 1.0, "seed": 40}
    r = server.complete(body)
    got = texts(r)
    assert [c["index"] for c in r.json()["choices"]] == list(range(6))
    for p, prompt in enumerate(prompts):
        for i in range(2):
            solo = server.complete({"prompt": prompt, "max_tokens": 12, "temperature": 1.0,
                                    "seed": 40 + p * 2 + i}).json()["choices"][0]["text"]
            assert got[p * 2 + i] == solo, (p, i)
    assert stream_texts(stream(server, body), 6) == got
    # the same with token-id prompts
    ids = [server.post("/tokenize", {"prompt": t}).json()["tokens"] for t in prompts]
    assert texts(server.complete(dict(body, prompt=ids))) == got


def test_n3_sampled(server):
    body = {"prompt": "Once upon a time", "n": 3, "max_tokens": 16, "temperature": 0.9,
            "seed": 5}
    r = server.complete(body).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert len({c["text"] for c in r["choices"]}) > 1
    assert all(c["finish_reason"] in ("stop", "length") for c in r["choices"])
    events = stream(server, body)
    assert {ch["index"] for ev in events for ch in ev["choices"]} == {0, 1, 2}
    assert stream_texts(events, 3) == [c["text"] for c in r["choices"]]


def test_same_seed_same_text(server):
    body = {"prompt": "The cat", "max_tokens": 24, "temperature": 1.2, "top_p": 0.95,
            "seed": 2024}
    a = texts(server.complete(body))
    assert texts(server.complete(body)) == a
    assert stream_texts(stream(server, body)) == a


def _tokens_with_text(srv, prompt, max_tokens):
    r = srv.complete({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                      "logprobs": 0, "ignore_eos": True}).json()["choices"][0]
    return r["text"], r["logprobs"]["tokens"]


def test_stop_strings_spanning_tokens(server):
    prompt = "Once upon a time"
    full, toks = _tokens_with_text(server, prompt, 60)
    assert "".join(toks) == full
    # stop strings that straddle token boundaries: the end of one token and
    # the start of the next, and one spanning three tokens
    pos, spans = 0, []
    for a, b in zip(toks, toks[1:]):
        pos += len(a)
        if len(a) >= 2 and len(b) >= 2:
            spans.append(full[pos - 2: pos + 2])
    assert len(spans) >= 3
    long_stop = "".join(toks[5:8])[1:-1]
    for stops in ([spans[0]], [spans[1], "zzzz"], [spans[2], "qqq", "xxxx", "yyy"],
                  [long_stop]):
        cut = min(full.find(s) for s in stops if s in full)
        body = {"prompt": prompt, "max_tokens": 60, "temperature": 0, "stop": stops,
                "ignore_eos": True}
        r = server.complete(body).json()["choices"][0]
        assert r["text"] == full[:cut], stops
        assert r["finish_reason"] == "stop"
        # streaming: pieces add up to exactly the cut text, so no part of the
        # stop string was ever sent
        events = stream(server, body)
        assert stream_texts(events) == [full[:cut]]
        finishes = [c["finish_reason"] for ev in events for c in ev["choices"]
                    if c["finish_reason"]]
        assert finishes == ["stop"]


def test_logprobs_of_a_choice_cut_by_a_stop_string(server):
    """A stop string that begins inside a token (or spans several) cuts the
    text; the tokens still spell it: the cut token reads what the choice
    kept, whole or streamed, and every generated token keeps its entry."""
    prompt = "Once upon a time"
    full, toks = _tokens_with_text(server, prompt, 40)
    # stops that begin inside a token: its second character on, and a span
    # from inside one token to inside the next
    mids = [i for i, t in enumerate(toks) if len(t) >= 3]
    assert len(mids) >= 2
    at = len("".join(toks[:mids[0]]))
    inside = full[at + 1: at + 3]
    at2 = len("".join(toks[:mids[1] + 1]))
    across = full[at2 - 2: at2 + 1]
    for stop in (inside, across):
        cut = full.find(stop)
        body = {"prompt": prompt, "max_tokens": 40, "temperature": 0, "stop": [stop],
                "ignore_eos": True, "logprobs": 2}
        r = server.complete(body).json()
        ch = r["choices"][0]
        assert ch["text"] == full[:cut], stop
        check_tokens_spell_text(ch["text"], ch["logprobs"])
        assert len(ch["logprobs"]["tokens"]) == r["usage"]["completion_tokens"]
        [(text, lp)] = streamed_logprobs(stream(server, dict(body, stream=True)))
        assert text == full[:cut]
        check_tokens_spell_text(text, lp)


def test_stop_validation(server):
    base = {"prompt": "x", "max_tokens": 2}
    check_error(server.complete(dict(base, stop=["a", "b", "c", "d", "e"])), 400,
                       param="stop")
    check_error(server.complete(dict(base, stop="")), 400, param="stop")
    check_error(server.complete(dict(base, stop=[1])), 400, param="stop")
    long = "a very long stop string " * 20
    assert server.complete(dict(base, stop=[long])).status_code == 200


@pytest.mark.parametrize("k", [0, 1, 5])
def test_logprobs_format(server, k):
    r = server.complete({"prompt": "The cat", "max_tokens": 8, "temperature": 0,
                         "logprobs": k, "ignore_eos": True})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    lp = ch["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    n = len(lp["tokens"])
    assert n == 8 == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert "".join(lp["tokens"]) == ch["text"]
    offset = 0
    for tok, val, top, off in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                                  lp["text_offset"]):
        assert off == offset
        assert ch["text"][off:].startswith(tok)
        offset += len(tok)
        assert val <= 0
        assert len(top) == k
        if k:
            assert math.isclose(val, max(top.values()), abs_tol=1e-6)


def test_logprobs_out_of_range(server):
    for bad in (6, -1, 2.5, True):
        check_error(server.complete({"prompt": "x", "logprobs": bad}), 400,
                           param="logprobs")


def test_echo_with_prompt_logprobs(server):
    """echo + logprobs: the prompt's tokens come first, the first with a null
    logprob; each other entry is the logprob of that prompt token given the
    tokens before it, i.e. what a generation from that prefix reports."""
    prompt = "Once upon a time there was"
    ids = server.post("/tokenize", {"prompt": prompt}).json()["tokens"]
    r = server.complete({"prompt": prompt, "max_tokens": 4, "temperature": 0, "echo": True,
                         "logprobs": 2})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    lp = ch["logprobs"]
    assert ch["text"].startswith(prompt)
    assert len(lp["tokens"]) == len(ids) + 4
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert "".join(lp["tokens"][1:len(ids)]) == prompt
    assert lp["text_offset"] == sorted(lp["text_offset"])
    assert lp["text_offset"][len(ids)] == len(prompt)
    for i in range(1, len(ids)):
        ref = server.complete({"prompt": ids[:i], "max_tokens": 1, "temperature": 0,
                               "logprobs": 2}).json()["choices"][0]["logprobs"]
        want = ref["top_logprobs"][0]
        got = lp["top_logprobs"][i]
        assert set(got) == set(want), (i, got, want)
        for key in want:
            assert math.isclose(got[key], want[key], rel_tol=1e-4, abs_tol=1e-4), (i, key)
        if ref["tokens"][0] == lp["tokens"][i]:
            assert math.isclose(lp["token_logprobs"][i], ref["token_logprobs"][0],
                                rel_tol=1e-4, abs_tol=1e-4)
    # the generated part equals the plain request's logprobs
    plain = server.complete({"prompt": prompt, "max_tokens": 4, "temperature": 0,
                             "logprobs": 2}).json()["choices"][0]["logprobs"]
    assert lp["tokens"][len(ids):] == plain["tokens"]
    assert [o - len(prompt) for o in lp["text_offset"][len(ids):]] == plain["text_offset"]


def test_echo_logprobs_streamed_and_max_tokens_zero(server):
    body = {"prompt": "Lily and Tom went to the park.", "max_tokens": 5, "temperature": 0,
            "echo": True, "logprobs": 1, "n": 2}
    whole = server.complete(body).json()
    events = stream(server, body)
    for idx in (0, 1):
        toks, lps = [], []
        for ev in events:
            for c in ev["choices"]:
                if c["index"] == idx and c["logprobs"]:
                    toks += c["logprobs"]["tokens"]
                    lps += c["logprobs"]["token_logprobs"]
        assert toks == whole["choices"][idx]["logprobs"]["tokens"]
        assert lps[0] is None
        assert lps == whole["choices"][idx]["logprobs"]["token_logprobs"]
    assert stream_texts(events, 2) == [c["text"] for c in whole["choices"]]
    zero = server.complete(dict(body, max_tokens=0, n=1)).json()["choices"][0]
    assert zero["text"] == body["prompt"]
    assert zero["logprobs"]["token_logprobs"][0] is None
    assert len(zero["logprobs"]["tokens"]) == whole["usage"]["prompt_tokens"]
    assert zero["logprobs"]["token_logprobs"][1:] == \
        whole["choices"][0]["logprobs"]["token_logprobs"][1:len(zero["logprobs"]["tokens"])]


def test_echo_logprobs_several_prompts(server):
    prompts = ["The cat", "Once upon"]
    r = server.complete({"prompt": prompts, "max_tokens": 2, "echo": True, "logprobs": 0,
                         "temperature": 0})
    assert r.status_code == 200, r.text
    for ch in r.json()["choices"]:
        assert ch["logprobs"]["token_logprobs"][0] is None
        assert all(v is not None for v in ch["logprobs"]["token_logprobs"][1:])


def test_long_prompt_echo_logprobs(server):
    """A prompt longer than one prefill chunk of prompt logprobs (128)."""
    prompt = "Once upon a time, there was a little girl named Lily. " * 12
    r = server.complete({"prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 1,
                         "temperature": 0})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    n_prompt = r.json()["usage"]["prompt_tokens"]
    assert n_prompt > 128
    assert len(lp["tokens"]) == n_prompt + 1
    assert all(v is not None and v <= 0 for v in lp["token_logprobs"][1:])
    # entries past the first chunks of 128 rows agree with generations from
    # the same prefix
    ids = server.post("/tokenize", {"prompt": prompt}).json()["tokens"]
    for i in (127, 128, 129, n_prompt - 2, n_prompt - 1):
        ref = server.complete({"prompt": ids[:i], "max_tokens": 1, "temperature": 0,
                               "logprobs": 1}).json()["choices"][0]["logprobs"]
        [(key, val)] = ref["top_logprobs"][0].items()
        assert math.isclose(lp["top_logprobs"][i][key], val, rel_tol=1e-4, abs_tol=1e-4), i


def check_tokens_spell_text(text, lp):
    """OpenAI's text_offset contract: the tokens, joined, are the choice's
    text, and text_offset[i] is where tokens[i] starts in it (in bytes)."""
    assert not any(t.startswith("bytes:") for t in lp["tokens"]), lp["tokens"]
    assert "".join(lp["tokens"]) == text, (lp["tokens"], text)
    at = 0
    for i, tok in enumerate(lp["tokens"]):
        assert lp["text_offset"][i] == at, (i, lp["tokens"], lp["text_offset"])
        at += len(tok.encode())


def streamed_logprobs(events, n_choices=1):
    """Per choice: (text, logprobs) with the streamed chunks' entries joined."""
    out = [("", {"tokens": [], "text_offset": []}) for _ in range(n_choices)]
    for ev in events:
        for c in ev["choices"]:
            text, lp = out[c["index"]]
            if c["logprobs"]:
                for key in ("tokens", "text_offset"):
                    lp[key] += c["logprobs"][key]
            out[c["index"]] = (text + c["text"], lp)
    return out


ECHO_PROMPTS = ["Once upon a time there was", " The cat sat", "Lily and Tom.  They ran",
                "  Ben  sat.  "]


@pytest.mark.parametrize("prompt", ECHO_PROMPTS)
@pytest.mark.parametrize("as_ids", ["text", "ids", "ids-no-bos"])
@pytest.mark.parametrize("max_tokens", [0, 6])
def test_echo_logprobs_tokens_spell_the_text(server, prompt, as_ids, max_tokens):
    """With echo, the prompt's tokens then the generated ones spell the
    returned text (the first word's dummy-prefix space included or not, as
    in the text), whole and streamed, for text and token-id prompts, with or
    without BOS; the text offsets agree."""
    ids = server.post("/tokenize", {"prompt": prompt}).json()["tokens"]
    src = {"text": prompt, "ids": ids, "ids-no-bos": ids[1:]}[as_ids]
    body = {"prompt": src, "max_tokens": max_tokens, "temperature": 0, "echo": True,
            "logprobs": 2, "n": 2}
    r = server.complete(body)
    assert r.status_code == 200, r.text
    for ch in r.json()["choices"]:
        assert len(ch["logprobs"]["tokens"]) == len(src if as_ids != "text" else ids) + max_tokens
        if as_ids == "text":
            assert ch["text"].startswith(prompt)
        check_tokens_spell_text(ch["text"], ch["logprobs"])
    for text, lp in streamed_logprobs(stream(server, body), 2):
        assert text == r.json()["choices"][0]["text"]
        check_tokens_spell_text(text, lp)


@pytest.mark.parametrize("as_ids", [False, True])
def test_echo_logprobs_offsets_with_non_ascii(server, as_ids):
    """A character split into byte-fallback tokens: each of them reads
    bytes:\\xNN and starts where the character does; every other token
    starts at its offset, and the next token starts after the character."""
    prompt = "The \u65e5 was open"
    ids = server.post("/tokenize", {"prompt": prompt}).json()["tokens"]
    r = server.complete({"prompt": ids if as_ids else prompt, "max_tokens": 0, "echo": True,
                         "logprobs": 0})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    text, lp = ch["text"].encode(), ch["logprobs"]
    assert ch["text"] == prompt
    assert any(t.startswith("bytes:") for t in lp["tokens"])
    offs = lp["text_offset"] + [len(text)]
    for i, tok in enumerate(lp["tokens"]):
        if tok.startswith("bytes:"):
            assert text[offs[i]:offs[i] + 1] == b"\xe6"
            assert offs[i + 1] in (offs[i], offs[i] + 3)
        else:
            assert text[offs[i]:offs[i + 1]] == tok.encode(), (i, lp["tokens"], offs)


@pytest.mark.parametrize("echo", [False, True])
@pytest.mark.parametrize("streamed", [False, True])
def test_logprobs_spell_text_after_a_bos_only_prompt(server, echo, streamed):
    """After a prompt of BOS alone the first generated word starts the text
    and has no leading space; its token, and the alternatives at that place,
    read the same."""
    bos = server.post("/tokenize", {"prompt": "x"}).json()["tokens"][0]
    body = {"prompt": [bos], "max_tokens": 6, "temperature": 0, "echo": echo,
            "logprobs": 3, "ignore_eos": True}
    if streamed:
        [(text, lp)] = streamed_logprobs(stream(server, body))
    else:
        ch = server.complete(body).json()["choices"][0]
        text, lp = ch["text"], ch["logprobs"]
        first = lp["top_logprobs"][1 if echo else 0]
        assert lp["tokens"][1 if echo else 0] in first
        assert not any(k.startswith(" ") for k in first), first
    assert text and not text.startswith(" ")
    check_tokens_spell_text(text, lp)


def test_return_token_ids(server):
    r = server.complete({"prompt": "The cat", "max_tokens": 6, "temperature": 0,
                         "return_token_ids": True})
    ch = r.json()["choices"][0]
    assert ch["prompt_token_ids"] == server.post("/tokenize", {"prompt": "The cat"}).json()[
        "tokens"]
    assert len(ch["token_ids"]) == r.json()["usage"]["completion_tokens"]
    full = server.post("/detokenize", {"tokens": ch["prompt_token_ids"] + ch["token_ids"]})
    assert full.json()["prompt"] == "The cat" + ch["text"]
    events = stream(server, {"prompt": "The cat", "max_tokens": 6, "temperature": 0,
                             "return_token_ids": True})
    streamed = [t for ev in events for c in ev["choices"] for t in c.get("token_ids", [])]
    assert streamed == ch["token_ids"]


def test_include_usage(server):
    body = {"prompt": ["The cat", "Once"], "max_tokens": 4, "n": 2,
            "stream_options": {"include_usage": True}}
    events = stream(server, body)
    last = events[-1]
    assert last["choices"] == []
    u = last["usage"]
    assert u["completion_tokens"] <= 16 and u["total_tokens"] == u["prompt_tokens"] + \
        u["completion_tokens"]
    assert all("usage" not in ev for ev in events[:-1])


def test_sampling_knobs_take_effect(server):
    base = {"prompt": "Once upon a time", "max_tokens": 12, "ignore_eos": True}
    greedy = texts(server.complete(dict(base, temperature=0)))[0]
    # min_p 1 keeps only the most likely token: greedy, whatever the seed
    for seed in (1, 2):
        assert texts(server.complete(dict(base, temperature=1.5, min_p=1.0, seed=seed)))[0] == greedy
    # top_k 1 likewise
    assert texts(server.complete(dict(base, temperature=1.5, top_k=1, seed=3)))[0] == greedy
    # logit_bias can forbid the greedy first token
    first = server.complete(dict(base, temperature=0, max_tokens=1,
                                 return_token_ids=True)).json()["choices"][0]["token_ids"][0]
    banned = server.complete(dict(base, temperature=0, max_tokens=1, return_token_ids=True,
                                  logit_bias={str(first): -100})).json()
    assert banned["choices"][0]["token_ids"][0] != first
    # a strong frequency penalty stops the story from repeating its tokens
    pen = server.complete(dict(base, temperature=0, max_tokens=40, frequency_penalty=2.0,
                               return_token_ids=True)).json()["choices"][0]["token_ids"]
    plain = server.complete(dict(base, temperature=0, max_tokens=40,
                                 return_token_ids=True)).json()["choices"][0]["token_ids"]
    assert len(set(pen)) > len(set(plain))
    rep = server.complete(dict(base, temperature=0, max_tokens=40, repetition_penalty=1.8,
                               return_token_ids=True)).json()["choices"][0]["token_ids"]
    assert rep != plain
    pres = server.complete(dict(base, temperature=0, max_tokens=40, presence_penalty=2.0,
                                return_token_ids=True)).json()["choices"][0]["token_ids"]
    assert pres != plain


@pytest.mark.parametrize("body,param", [
    ({"suffix": "and then"}, "suffix"),
    ({"suffix": 3}, "suffix"),
    ({"best_of": 3}, "best_of"),
    ({"best_of": 2, "n": 3}, "best_of"),
    ({"best_of": 0}, "best_of"),
])
def test_refused_fields(server, body, param):
    check_error(server.complete({"prompt": "x", "max_tokens": 2, **body}), 400,
                       param=param)
    check_error(server.complete({"prompt": "x", "max_tokens": 2, "stream": True,
                                        **body}), 400, param=param)


def test_harmless_values_accepted(server):
    for body in ({"suffix": ""}, {"suffix": None}, {"best_of": 2, "n": 2}, {"user": "u-1"},
                 {"return_token_ids": False}):
        r = server.complete({"prompt": "x", "max_tokens": 2, **body})
        assert r.status_code == 200, (body, r.text)


def test_nul_byte_token_does_not_cut_the_text(server):
    """The <0x00> byte token (id 3) can be generated: it shows as U+FFFD and
    the text after it is kept, whole and streamed alike."""
    body = {"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0,
            "logit_bias": {"3": 22}, "return_token_ids": True, "ignore_eos": True}
    r = server.complete(body)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    ids = ch["token_ids"]
    assert 3 in ids and ids.index(3) < len(ids) - 3, ids
    after = server.post("/detokenize", {"tokens": ids[ids.index(3) + 1:]}).json()["prompt"]
    assert ch["text"].endswith(after.strip()), (ch["text"], after)
    assert "\ufffd" in ch["text"]
    events, done = parse_sse(server.complete({**body, "stream": True}, stream=True))
    assert done and stream_texts(events)[0] == ch["text"]
    assert server.post("/detokenize", {"tokens": [12, 3, 13]}).json()["prompt"] == "\t\ufffd\n"
