"""Streaming sends whole UTF-8 characters only (docs/api.md, Streaming), checked on
tiny-llama2 (the real Llama-2 tokenizer): a Chinese prompt, generation
pushed by logit_bias onto byte-fallback tokens so that characters are spread
over several tokens, read event by event. Every event must be valid UTF-8 on
its own, the pieces must add up to the non-streamed text, and that text must
be decode(prompt + generated) - decode(prompt) as /detokenize computes it."""
import json

import pytest
import requests

PROMPT = "大模型推理部署，显存利用率"
BYTE0 = 3   # Llama-2: <0x00> .. <0xFF> are ids 3 .. 258


def byte_bias(leads=range(0xE4, 0xEA), conts=range(0x80, 0xC0), lead_bias=100,
              cont_bias=98):
    bias = {str(BYTE0 + b): cont_bias for b in conts}
    bias.update({str(BYTE0 + b): lead_bias for b in leads})
    return bias


def raw_events(srv, path, body):
    """The SSE events as raw bytes, each checked to be valid UTF-8 alone."""
    with requests.post(srv.url + path, json=dict(body, stream=True), stream=True,
                       timeout=120) as r:
        assert r.status_code == 200, r.text
        raw = b"".join(r.iter_content(chunk_size=None))
    assert raw.endswith(b"data: [DONE]\n\n")
    events = []
    for block in raw.split(b"\n\n")[:-2]:
        assert block.startswith(b"data: ")
        text = block[6:].decode("utf-8")          # strict: raises on a split character
        events.append(json.loads(text))
    return events


def completion_pieces(events):
    return [c["text"] for ev in events for c in ev["choices"]]


def expected_text(srv, prompt_ids, gen_ids):
    full = srv.post("/detokenize", {"tokens": prompt_ids + gen_ids}).json()["prompt"]
    head = srv.post("/detokenize", {"tokens": prompt_ids}).json()["prompt"]
    assert full.startswith(head)
    return full[len(head):]


def test_chinese_prompt_streamed_token_by_token(tiny_server):
    prompt_ids = tiny_server.post("/tokenize", {"prompt": PROMPT}).json()["tokens"]
    formed = 0
    for seed in range(6):
        body = {"prompt": PROMPT, "max_tokens": 48, "temperature": 1.0, "seed": seed,
                "logit_bias": byte_bias(lead_bias=100), "ignore_eos": True,
                "return_token_ids": True}
        whole = tiny_server.complete(body).json()["choices"][0]
        ids = whole["token_ids"]
        assert len(ids) == 48
        assert all(BYTE0 <= i < BYTE0 + 256 for i in ids)
        assert whole["text"] == expected_text(tiny_server, prompt_ids, ids)
        events = raw_events(tiny_server, "/v1/completions", body)
        pieces = completion_pieces(events)
        assert "".join(pieces) == whole["text"]
        # the streamed token ids add up too
        assert sum(len(ev["choices"][0].get("token_ids", [])) for ev in events) == 48
        for p in pieces:
            # a held-back byte never turns into U+FFFD too early: every
            # replacement character in a piece is one of the final text's
            assert p.count("\ufffd") <= whole["text"].count("\ufffd")
        formed += sum(1 for ch in whole["text"] if ord(ch) >= 0x4E00 and ch != "\ufffd")
    assert formed > 0, "no multi-byte character was formed from byte tokens"


def test_emoji_and_cjk_pieces_complete_per_event(tiny_server):
    """Generation forced through the 4-byte lead F0 and continuation bytes:
    an event may only carry complete characters; the stream equals the whole."""
    body = {"prompt": "emoji 🦙", "max_tokens": 40, "temperature": 1.0, "seed": 11,
            "logit_bias": byte_bias(leads=[0xF0], conts=range(0x80, 0xC0), lead_bias=100),
            "ignore_eos": True}
    whole = tiny_server.complete(body).json()["choices"][0]["text"]
    assert "".join(completion_pieces(raw_events(tiny_server, "/v1/completions", body))) == whole


def test_chinese_echo_and_chat_stream(tiny_server):
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "echo": True}
    whole = tiny_server.complete(body).json()["choices"][0]["text"]
    pieces = completion_pieces(raw_events(tiny_server, "/v1/completions", body))
    assert pieces[0] == PROMPT
    assert "".join(pieces) == whole
    chat = {"messages": [{"role": "system", "content": "用中文回答。"},
                         {"role": "user", "content": PROMPT}],
            "max_tokens": 24, "temperature": 1.0, "seed": 4,
            "logit_bias": byte_bias(lead_bias=100)}
    whole = tiny_server.post("/v1/chat/completions", chat).json()["choices"][0]["message"][
        "content"]
    events = raw_events(tiny_server, "/v1/chat/completions", chat)
    got = "".join(c["delta"].get("content", "") for ev in events for c in ev["choices"])
    assert got == whole


@pytest.mark.parametrize("stop", ["型", "推理", "\ufffd"])
def test_cjk_stop_strings(tiny_server, stop):
    """Stop strings made of multi-byte characters cut exactly, streamed or not."""
    body = {"prompt": PROMPT, "max_tokens": 64, "temperature": 1.0, "seed": 2,
            "logit_bias": {**byte_bias(lead_bias=100),
                           **{str(i): 99 for i in tiny_server.post(
                               "/tokenize", {"prompt": "型推理", "add_special_tokens": False}
                           ).json()["tokens"]}},
            "ignore_eos": True}
    full = tiny_server.complete(body).json()["choices"][0]["text"]
    r = tiny_server.complete(dict(body, stop=[stop])).json()["choices"][0]
    if stop in full:
        assert r["text"] == full[:full.find(stop)]
        assert r["finish_reason"] == "stop"
    else:
        assert r["text"] == full
    pieces = completion_pieces(raw_events(tiny_server, "/v1/completions", dict(body, stop=[stop])))
    assert "".join(pieces) == r["text"]
