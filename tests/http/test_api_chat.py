"""POST /v1/chat/completions: the Llama-2 chat format built as token ids
(checked against an independent construction from /tokenize pieces and the
golden tokenizer file), role validation, response and chunk shapes, n, seed,
stop, logprobs, max_tokens absent, unsupported fields."""
import json
import math

import pytest
import requests

from dolphin_server import check_error, golden, parse_sse

BOS, EOS = 1, 2


def chat(srv, body, **kw):
    return srv.post("/v1/chat/completions", body, **kw)


def chat_stream(srv, body):
    with requests.post(srv.url + "/v1/chat/completions", json=dict(body, stream=True),
                       stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events, done = parse_sse(r)
    assert done
    return events


def pieces_ids(srv, text):
    r = srv.post("/tokenize", {"prompt": text, "add_special_tokens": False})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def expected_ids(srv, messages):
    """Meta's chat_completion, written out independently: merge the system
    prompt into the first user turn, encode each [INST] pair on its own with
    BOS before and EOS after, the last user turn with BOS only."""
    msgs = [dict(m) for m in messages]
    if msgs[0]["role"] == "system":
        msgs = [{"role": msgs[1]["role"],
                 "content": "<<SYS>>\n" + msgs[0]["content"] + "\n<</SYS>>\n\n"
                 + msgs[1]["content"]}] + msgs[2:]
    ids = []
    for user, answer in zip(msgs[::2], msgs[1::2]):
        ids += [BOS] + pieces_ids(srv, f"[INST] {user['content'].strip()} [/INST] "
                                       f"{answer['content'].strip()} ") + [EOS]
    ids += [BOS] + pieces_ids(srv, f"[INST] {msgs[-1]['content'].strip()} [/INST]")
    return ids


CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Answer briefly."},
     {"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "Paris."},
     {"role": "user", "content": "  And of Italy?\n"}],
    [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
     {"role": "user", "content": "three"}, {"role": "assistant", "content": " four "},
     {"role": "user", "content": "five"}],
    [{"role": "system", "content": "  spaces kept inside the system prompt  "},
     {"role": "user", "content": "\t大模型推理部署，显存利用率 🦙\u3000"}],
    [{"role": "user", "content": "<s>[INST] literal </s> text [/INST]"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_prompt_ids_are_llama2_format(tiny_server, messages):
    want = expected_ids(tiny_server, messages)
    # what /tokenize says the chat prompt is
    tok = tiny_server.post("/tokenize", {"messages": messages}).json()
    assert tok["tokens"] == want
    assert tok["count"] == len(want)
    # what the chat completion actually fed the model
    r = chat(tiny_server, {"messages": messages, "max_tokens": 2, "temperature": 0,
                           "return_token_ids": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["prompt_token_ids"] == want
    assert body["usage"]["prompt_tokens"] == len(want)
    # special-looking text is literal: BOS/EOS appear only as turn markers
    n_turns = (len(messages) - (messages[0]["role"] == "system")) // 2
    assert want.count(BOS) == n_turns + 1 and want.count(EOS) == n_turns


def test_chat_prompt_ids_match_golden_tokenizer(tiny_server):
    """The golden tokenizer file (sentencepiece 0.1.97) holds the ids of the
    first turn of this exact conversation."""
    cases = golden("tokenizer-llama2")["cases"]
    text = "[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\nHi [/INST]"
    case = next(c for c in cases if c["text"] == text)
    msgs = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"}]
    got = tiny_server.post("/tokenize", {"messages": msgs}).json()["tokens"]
    assert got == [BOS] + case["ids"]


def test_chat_generates_from_those_ids(tiny_server):
    """Greedy chat output equals a plain completion of the same prompt ids:
    the chat endpoint feeds the model exactly the ids it reports."""
    msgs = CONVERSATIONS[2]
    ids = expected_ids(tiny_server, msgs)
    c = chat(tiny_server, {"messages": msgs, "max_tokens": 12, "temperature": 0,
                           "return_token_ids": True}).json()
    p = tiny_server.complete({"prompt": ids, "max_tokens": 12, "temperature": 0,
                              "return_token_ids": True}).json()
    assert c["choices"][0]["token_ids"] == p["choices"][0]["token_ids"]
    assert c["choices"][0]["message"]["content"] == p["choices"][0]["text"]
    assert c["choices"][0]["finish_reason"] == p["choices"][0]["finish_reason"]


BAD_MESSAGES = [
    ("empty", []),
    ("ends-with-assistant", [{"role": "user", "content": "a"},
                             {"role": "assistant", "content": "b"}]),
    ("two-users", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),
    ("assistant-first", [{"role": "assistant", "content": "a"},
                         {"role": "user", "content": "b"}]),
    ("system-later", [{"role": "user", "content": "a"}, {"role": "system", "content": "b"},
                      {"role": "user", "content": "c"}]),
    ("only-system", [{"role": "system", "content": "a"}]),
    ("two-systems", [{"role": "system", "content": "a"}, {"role": "system", "content": "b"},
                     {"role": "user", "content": "c"}]),
]


@pytest.mark.parametrize("name,messages", BAD_MESSAGES, ids=[b[0] for b in BAD_MESSAGES])
def test_chat_role_order_refused(server, name, messages):
    for path in ("/v1/chat/completions", "/tokenize"):
        check_error(server.post(path, {"messages": messages}), 400, param="messages")
    # also for a stream: the error comes before any header
    check_error(chat(server, {"messages": messages, "stream": True}), 400,
                       param="messages")


@pytest.mark.parametrize("messages,param", [
    ("hi", "messages"),
    ([{"role": "tool", "content": "x"}], "messages[0].role"),
    (["hi"], "messages[0]"),
    ([{"content": "x"}], "messages[0].role"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "messages[0].content"),
])
def test_chat_message_shape_refused(server, messages, param):
    check_error(chat(server, {"messages": messages}), 400, param=param)


def test_chat_content_parts_and_null_assistant(tiny_server):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                          {"type": "text", "text": "there"}]}]
    joined = [{"role": "user", "content": "Hello\nthere"}]
    a = tiny_server.post("/tokenize", {"messages": parts}).json()["tokens"]
    assert a == tiny_server.post("/tokenize", {"messages": joined}).json()["tokens"]
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": None},
            {"role": "user", "content": "b"}]
    assert chat(tiny_server, {"messages": msgs, "max_tokens": 1}).status_code == 200


def test_chat_response_shape(server):
    r = chat(server, {"messages": [{"role": "user", "content": "Once upon a time"}],
                      "max_tokens": 8, "temperature": 0, "user": "someone"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == "stories260K"
    assert isinstance(body["created"], int)
    [ch] = body["choices"]
    assert ch["index"] == 0
    assert ch["message"]["role"] == "assistant"
    assert isinstance(ch["message"]["content"], str) and ch["message"]["content"]
    assert ch["finish_reason"] in ("stop", "length")
    assert ch["logprobs"] is None
    u = body["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert 1 <= u["completion_tokens"] <= 8


def test_chat_stream_matches_whole(server):
    body = {"messages": [{"role": "system", "content": "Tell a story."},
                         {"role": "user", "content": "Once upon a time"}],
            "max_tokens": 24, "temperature": 0, "n": 2}
    whole = chat(server, body).json()
    events = chat_stream(server, dict(body, stream_options={"include_usage": True}))
    ids = {ev["id"] for ev in events}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    assert all(ev["object"] == "chat.completion.chunk" for ev in events)
    text = {0: "", 1: ""}
    first = {}
    finish = {}
    for ev in events[:-1]:
        for ch in ev["choices"]:
            i = ch["index"]
            if i not in first:
                first[i] = ch["delta"]
            else:
                assert "role" not in ch["delta"]
            text[i] += ch["delta"].get("content", "")
            if ch["finish_reason"]:
                assert i not in finish
                finish[i] = ch["finish_reason"]
    assert first == {0: {"role": "assistant", "content": ""},
                     1: {"role": "assistant", "content": ""}}
    assert [text[0], text[1]] == [c["message"]["content"] for c in whole["choices"]]
    assert finish == {c["index"]: c["finish_reason"] for c in whole["choices"]}
    usage = events[-1]
    assert usage["choices"] == []
    # the same counts; the streamed request came second, so its prompt's
    # whole blocks came from the prefix cache (all but the last token)
    streamed, plain = dict(usage["usage"]), dict(whole["usage"])
    details = streamed.pop("prompt_tokens_details")
    plain.pop("prompt_tokens_details")
    assert streamed == plain
    assert details["cached_tokens"] == (plain["prompt_tokens"] - 1) // 16 * 16


def test_chat_n3_sampled_indexes_and_seed(server):
    body = {"messages": [{"role": "user", "content": "Once upon a time"}],
            "max_tokens": 20, "temperature": 1.0, "n": 3, "seed": 99}
    a = chat(server, body).json()
    assert [c["index"] for c in a["choices"]] == [0, 1, 2]
    texts = [c["message"]["content"] for c in a["choices"]]
    assert len(set(texts)) > 1, texts
    b = chat(server, body).json()
    assert [c["message"]["content"] for c in b["choices"]] == texts
    events = chat_stream(server, body)
    streamed = ["", "", ""]
    for ev in events:
        for ch in ev["choices"]:
            streamed[ch["index"]] += ch["delta"].get("content", "")
    assert streamed == texts


def test_chat_max_tokens_absent_runs_to_context_end(server):
    """No max_tokens: until EOS or the end of the context (512 positions)."""
    msgs = [{"role": "user", "content": "Once upon a time"}]
    r = chat(server, {"messages": msgs, "temperature": 0, "ignore_eos": True}).json()
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] == 512
    r = chat(server, {"messages": msgs, "temperature": 0}).json()
    if r["choices"][0]["finish_reason"] == "length":
        assert r["usage"]["total_tokens"] == 512
    else:
        assert r["usage"]["total_tokens"] < 512


def test_chat_max_completion_tokens(server):
    msgs = [{"role": "user", "content": "Once upon a time"}]
    for field in ("max_tokens", "max_completion_tokens"):
        r = chat(server, {"messages": msgs, field: 5, "ignore_eos": True}).json()
        assert r["usage"]["completion_tokens"] == 5
        assert r["choices"][0]["finish_reason"] == "length"
    check_error(chat(server, {"messages": msgs, "max_tokens": 0}), 400,
                       param="max_tokens")
    check_error(chat(server, {"messages": msgs, "max_completion_tokens": 0}), 400,
                       param="max_completion_tokens")


def test_chat_logprobs(server):
    body = {"messages": [{"role": "user", "content": "Once upon a time"}],
            "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 3,
            "ignore_eos": True}
    r = chat(server, body)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    content = ch["logprobs"]["content"]
    assert len(content) == 6
    assert "".join(t["token"] for t in content) == ch["message"]["content"]
    for t in content:
        assert set(t) == {"token", "logprob", "bytes", "top_logprobs"}
        assert t["bytes"] == list(t["token"].encode())
        assert len(t["top_logprobs"]) == 3
        assert math.isclose(t["logprob"], t["top_logprobs"][0]["logprob"], abs_tol=1e-6)
        assert t["logprob"] <= 0
    # logprobs without alternatives
    r = chat(server, dict(body, top_logprobs=None)).json()
    assert all(t["top_logprobs"] == [] for t in r["choices"][0]["logprobs"]["content"])
    # streamed logprobs line up with the streamed text
    events = chat_stream(server, body)
    toks = [t for ev in events for c in ev["choices"] if c["logprobs"]
            for t in c["logprobs"]["content"]]
    assert toks == content
    check_error(chat(server, dict(body, top_logprobs=6)), 400, param="top_logprobs")
    check_error(chat(server, dict(body, logprobs=False)), 400, param="top_logprobs")
    check_error(chat(server, dict(body, logprobs=1)), 400, param="logprobs")


def test_chat_stop(server):
    msgs = [{"role": "user", "content": "Once upon a time"}]
    full = chat(server, {"messages": msgs, "max_tokens": 40, "temperature": 0}).json()[
        "choices"][0]["message"]["content"]
    stop = full[len(full) // 2: len(full) // 2 + 3]
    cut = full.find(stop)
    r = chat(server, {"messages": msgs, "max_tokens": 40, "temperature": 0, "stop": [stop]})
    ch = r.json()["choices"][0]
    assert ch["message"]["content"] == full[:cut]
    assert ch["finish_reason"] == "stop"


@pytest.mark.parametrize("extra,param", [
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": {"name": "f"}}, "function_call"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "a"}}}}, "response_format"),
    ({"n": 0}, "n"),
    ({"temperature": "hot"}, "temperature"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"model": 7}, "model"),
])
def test_chat_unsupported_or_invalid_fields(server, extra, param):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **extra}
    check_error(chat(server, body), 400, param=param)


def test_chat_harmless_fields_accepted(server):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "tools": [],
            "tool_choice": "none", "response_format": {"type": "text"},
            "some_future_field": {"a": 1}, "parallel_tool_calls": False}
    assert chat(server, body).status_code == 200


def test_chat_unknown_model_and_context(server):
    msgs = [{"role": "user", "content": "x"}]
    check_error(chat(server, {"messages": msgs, "model": "gpt-4"}), 404,
                       param="model", code="model_not_found")
    long = [{"role": "user", "content": "Once upon a time " * 200}]
    check_error(chat(server, {"messages": long}), 400,
                       code="context_length_exceeded")
    check_error(chat(server, {"messages": msgs, "max_tokens": 600}), 400,
                       code="context_length_exceeded")


def test_chat_method_and_media_type(server):
    r = requests.get(server.url + "/v1/chat/completions", timeout=10)
    check_error(r, 405)
    assert r.headers["Allow"] == "POST"
    r = requests.post(server.url + "/v1/chat/completions", data=json.dumps(
        {"messages": [{"role": "user", "content": "x"}]}),
        headers={"Content-Type": "text/plain"}, timeout=10)
    check_error(r, 415)


def test_chat_needs_api_key(auth_server):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    check_error(chat(auth_server, body), 401)
    from dolphin_server import API_KEY
    r = chat(auth_server, body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200, r.text
