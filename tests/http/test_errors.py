"""Malformed and invalid requests: each gets the right 4xx with OpenAI's
error shape ({"error":{"message","type","param","code"}}), and the server
keeps answering valid requests afterwards."""
import json
import socket

import pytest
import requests
import yaml

from dolphin_server import API_KEY, REPO, check_error, raw_exchange

JSON = {"Content-Type": "application/json"}

# (id, raw body, expected status, expected param or None, expected code or None)
RAW_BODIES = [
    ("bad-json", b"{", 400, None, None),
    ("truncated", b'{"prompt": "abc"', 400, None, None),
    ("truncated-string", b'{"prompt": "ab', 400, None, None),
    ("trailing-garbage", b'{"prompt": "a"} x', 400, None, None),
    ("two-objects", b'{"prompt": "a"}{"prompt": "b"}', 400, None, None),
    ("empty-body", b"", 400, None, None),
    ("whitespace-body", b"   \n", 400, None, None),
    ("array-body", b'[{"prompt": "a"}]', 400, None, None),
    ("string-body", b'"hello"', 400, None, None),
    ("null-body", b"null", 400, None, None),
    ("number-body", b"42", 400, None, None),
    ("single-quotes", b"{'prompt': 'a'}", 400, None, None),
    ("invalid-utf8", b'{"prompt": "\xff\xfe"}', 400, None, None),
    ("overlong-utf8", b'{"prompt": "\xc0\xaf"}', 400, None, None),
    ("raw-surrogate-utf8", b'{"prompt": "\xed\xa0\x80"}', 400, None, None),
    ("truncated-utf8", b'{"prompt": "\xe4\xbd"}', 400, None, None),
    ("lone-surrogate-escape", b'{"prompt": "\\ud800"}', 400, None, None),
    ("nul-escape", b'{"prompt": "a\\u0000b"}', 400, None, None),
    ("non-hex-escape", b'{"prompt": "a\\u12G4b"}', 400, None, None),
    ("raw-nul", b'{"prompt": "a\x00b"}', 400, None, None),
    ("nan", b'{"prompt": "a", "temperature": NaN}', 400, None, None),
    ("infinity", b'{"prompt": "a", "temperature": Infinity}', 400, None, None),
    ("huge-exponent", b'{"prompt": "a", "temperature": 1e999}', 400, "temperature", None),
    ("deep-nesting", b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, None, None),
]

# (id, JSON body, expected param, expected status, expected code)
FIELD_CASES = [
    ("missing-prompt", {"max_tokens": 4}, "prompt", 400, None),
    ("prompt-null", {"prompt": None}, "prompt", 400, None),
    ("prompt-number", {"prompt": 123}, "prompt", 400, None),
    ("prompt-bool", {"prompt": True}, "prompt", 400, None),
    ("prompt-object", {"prompt": {"text": "a"}}, "prompt", 400, None),
    ("prompt-empty-array", {"prompt": []}, "prompt", 400, None),
    ("prompt-mixed", {"prompt": [1, "a"]}, "prompt", 400, None),
    ("prompt-float-id", {"prompt": [1, 2.5]}, "prompt", 400, None),
    ("prompt-negative-id", {"prompt": [1, -1]}, "prompt", 400, None),
    ("prompt-id-out-of-range", {"prompt": [1, 512]}, "prompt", 400, None),
    ("prompt-huge-id", {"prompt": [1, 1e30]}, "prompt", 400, None),
    ("prompt-empty-id-list", {"prompt": [[1, 2], []]}, "prompt", 400, None),
    ("prompt-nested-strings", {"prompt": [["a"]]}, "prompt", 400, None),
    ("prompt-strings-and-ids", {"prompt": ["a", [1, 2]]}, "prompt", 400, None),
    ("prompt-too-many", {"prompt": ["a"] * 65}, "prompt", 400, None),
    ("max-tokens-negative", {"prompt": "a", "max_tokens": -1}, "max_tokens", 400, None),
    ("max-tokens-string", {"prompt": "a", "max_tokens": "16"}, "max_tokens", 400, None),
    ("max-tokens-float", {"prompt": "a", "max_tokens": 1.5}, "max_tokens", 400, None),
    ("max-tokens-bool", {"prompt": "a", "max_tokens": True}, "max_tokens", 400, None),
    ("max-tokens-zero-no-echo", {"prompt": "a", "max_tokens": 0}, "max_tokens", 400, None),
    ("max-tokens-huge", {"prompt": "a", "max_tokens": 1e300}, "max_tokens", 400, None),
    ("max-tokens-past-context", {"prompt": "Once upon a time", "max_tokens": 600},
     "max_tokens", 400, "context_length_exceeded"),
    ("prompt-ids-past-context", {"prompt": [1] + [300] * 509, "max_tokens": 16},
     "max_tokens", 400, "context_length_exceeded"),
    ("prompt-alone-past-context", {"prompt": [1] + [300] * 520, "max_tokens": 1},
     "prompt", 400, "context_length_exceeded"),
    ("temperature-negative", {"prompt": "a", "temperature": -0.1}, "temperature", 400, None),
    ("temperature-too-high", {"prompt": "a", "temperature": 2.5}, "temperature", 400, None),
    ("temperature-string", {"prompt": "a", "temperature": "hot"}, "temperature", 400, None),
    ("top-p-zero", {"prompt": "a", "top_p": 0}, "top_p", 400, None),
    ("top-p-too-high", {"prompt": "a", "top_p": 1.5}, "top_p", 400, None),
    ("top-p-list", {"prompt": "a", "top_p": [0.5]}, "top_p", 400, None),
    ("top-k-below-minus-one", {"prompt": "a", "top_k": -2}, "top_k", 400, None),
    ("top-k-float", {"prompt": "a", "top_k": 2.5}, "top_k", 400, None),
    ("min-p-too-high", {"prompt": "a", "min_p": 2}, "min_p", 400, None),
    ("n-zero", {"prompt": "a", "n": 0}, "n", 400, None),
    ("n-too-many", {"prompt": "a", "n": 17}, "n", 400, None),
    ("n-string", {"prompt": "a", "n": "2"}, "n", 400, None),
    ("n-above-batch-size", {"prompt": "a", "n": 9}, "n", 400, None),
    ("best-of-differs", {"prompt": "a", "best_of": 3}, "best_of", 400, None),
    ("stop-number", {"prompt": "a", "stop": 5}, "stop", 400, None),
    ("stop-too-many", {"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, "stop", 400, None),
    ("stop-empty-string", {"prompt": "a", "stop": ""}, "stop", 400, None),
    ("stop-empty-in-list", {"prompt": "a", "stop": ["x", ""]}, "stop", 400, None),
    ("stop-list-of-numbers", {"prompt": "a", "stop": [1]}, "stop", 400, None),
    ("stream-string", {"prompt": "a", "stream": "yes"}, "stream", 400, None),
    ("stream-number", {"prompt": "a", "stream": 1}, "stream", 400, None),
    ("stream-options-without-stream", {"prompt": "a", "stream_options": {"include_usage": True}},
     "stream_options", 400, None),
    ("stream-options-not-object", {"prompt": "a", "stream": True, "stream_options": "x"},
     "stream_options", 400, None),
    ("include-usage-string", {"prompt": "a", "stream": True,
                              "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage", 400, None),
    ("seed-float", {"prompt": "a", "seed": 1.5}, "seed", 400, None),
    ("seed-string", {"prompt": "a", "seed": "1"}, "seed", 400, None),
    ("seed-too-big", {"prompt": "a", "seed": 1e30}, "seed", 400, None),
    ("logprobs-too-many", {"prompt": "a", "logprobs": 6}, "logprobs", 400, None),
    ("logprobs-negative", {"prompt": "a", "logprobs": -1}, "logprobs", 400, None),
    ("logprobs-bool", {"prompt": "a", "logprobs": True}, "logprobs", 400, None),
    ("echo-string", {"prompt": "a", "echo": "yes"}, "echo", 400, None),
    ("user-number", {"prompt": "a", "user": 5}, "user", 400, None),
    ("model-number", {"prompt": "a", "model": 5}, "model", 400, None),
    ("model-unknown", {"prompt": "a", "model": "gpt-4"}, "model", 404, "model_not_found"),
    ("presence-penalty-range", {"prompt": "a", "presence_penalty": 3}, "presence_penalty", 400, None),
    ("frequency-penalty-range", {"prompt": "a", "frequency_penalty": -3},
     "frequency_penalty", 400, None),
    ("repetition-penalty-zero", {"prompt": "a", "repetition_penalty": 0},
     "repetition_penalty", 400, None),
    ("logit-bias-array", {"prompt": "a", "logit_bias": [1]}, "logit_bias", 400, None),
    ("logit-bias-bad-key", {"prompt": "a", "logit_bias": {"abc": 1}}, "logit_bias", 400, None),
    ("logit-bias-range", {"prompt": "a", "logit_bias": {"5": 200}}, "logit_bias", 400, None),
    ("logit-bias-id-range", {"prompt": "a", "logit_bias": {"99999": 1}}, "logit_bias", 400, None),
    ("ignore-eos-string", {"prompt": "a", "ignore_eos": "x"}, "ignore_eos", 400, None),
]


@pytest.mark.parametrize("body,status,param,code",
                         [pytest.param(b, s, p, c, id=i) for i, b, s, p, c in RAW_BODIES])
def test_raw_body(server, body, status, param, code):
    r = requests.post(server.url + "/v1/completions", data=body, headers=JSON, timeout=30)
    check_error(r, status, param, code)


@pytest.mark.parametrize("body,param,status,code",
                         [pytest.param(b, p, s, c, id=i) for i, b, p, s, c in FIELD_CASES])
def test_field(server, body, param, status, code):
    r = server.complete(body, timeout=30)
    err = check_error(r, status, param, code)
    if status == 400:
        assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("body,param", [
    pytest.param({"prompt": "a", "max_tokens": 4, "stream": True, "temperature": 5},
                 "temperature", id="temperature"),
    pytest.param({"prompt": "a", "stream": True, "max_tokens": 600}, "max_tokens", id="context"),
    pytest.param({"prompt": [1, 9999], "stream": True}, "prompt", id="token-id"),
])
def test_stream_validated_before_headers(server, body, param):
    """A streaming request with bad parameters gets a JSON 4xx, not a 200
    followed by an error event."""
    r = server.complete(body, timeout=30)
    check_error(r, 400, param)
    assert not r.headers["Content-Type"].startswith("text/event-stream")


def test_context_length_message_names_numbers(server):
    r = server.complete({"prompt": "Once upon a time", "max_tokens": 600})
    err = check_error(r, 400, "max_tokens", "context_length_exceeded")
    for n in ("512", "600", "605", "5"):
        assert n in err["message"], err["message"]


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", "application/jsonx"])
def test_wrong_content_type(server, ctype):
    r = requests.post(server.url + "/v1/completions", data=b'{"prompt":"a","max_tokens":1}',
                      headers={"Content-Type": ctype}, timeout=30)
    check_error(r, 415)


@pytest.mark.parametrize("ctype", [None, "application/json; charset=utf-8",
                                   "Application/JSON", "application/json ;charset=UTF-8"])
def test_accepted_content_types(server, ctype):
    headers = {"Content-Type": ctype} if ctype else {}
    r = requests.post(server.url + "/v1/completions", data=b'{"prompt":"a","max_tokens":1}',
                      headers=headers, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("method,path,allow", [
    ("GET", "/v1/completions", "POST"),
    ("PUT", "/v1/completions", "POST"),
    ("DELETE", "/v1/models", "GET"),
    ("POST", "/v1/models", "GET"),
    ("POST", "/v1/models/stories260K", "GET"),
    ("PUT", "/healthz", "GET"),
    ("POST", "/livez", "GET"),
])
def test_wrong_method(server, method, path, allow):
    r = requests.request(method, server.url + path, json={}, timeout=30)
    check_error(r, 405)
    assert allow in r.headers.get("Allow", "")


@pytest.mark.parametrize("method,path", [
    ("GET", "/"),
    ("GET", "/v1/unknown"),
    ("POST", "/v1/completion"),
    ("POST", "/v1/completions/"),
    ("GET", "/v2/models"),
    ("GET", "/v1/models/"),
    ("GET", "/%ff%fe"),
])
def test_unknown_route(server, method, path):
    r = requests.request(method, server.url + path, timeout=30)
    check_error(r, 404)


def test_unknown_model_route(server):
    r = requests.get(server.url + "/v1/models/not-a-model", timeout=30)
    check_error(r, 404, "model", "model_not_found")


def test_body_too_large(server):
    body = b'{"prompt": "' + b"a" * (1200 * 1024) + b'"}'
    r = requests.post(server.url + "/v1/completions", data=body, headers=JSON, timeout=60)
    check_error(r, 413)


def test_body_too_large_with_expect_continue(server):
    """With Expect: 100-continue the 413 comes before any of the body is sent."""
    data = raw_exchange(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Type: application/json\r\nContent-Length: 50000000\r\n"
                        b"Expect: 100-continue\r\n\r\n", head_only=True, timeout=30)
    assert data.startswith(b"HTTP/1.1 413"), data[:200]


def test_huge_chunked_body(server):
    def gen():
        yield b'{"prompt": "'
        for _ in range(40):
            yield b"a" * 65536
        yield b'"}'
    r = requests.post(server.url + "/v1/completions", data=gen(), headers=JSON, timeout=60)
    check_error(r, 413)


def test_unknown_fields_ignored(server):
    r = server.complete({"prompt": "Once", "max_tokens": 2, "foo": 1, "bar": {"x": [1, None]},
                         "suffix_unknown": "x"})
    assert r.status_code == 200, r.text


def test_nulls_mean_defaults(server):
    r = server.complete({"prompt": "Once", "max_tokens": None, "temperature": None, "top_p": None,
                         "n": None, "stop": None, "stream": None, "seed": None,
                         "logprobs": None, "echo": None, "user": None, "model": None,
                         "temperature_unknown": None})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 16


def test_valid_request_after_errors(server, stories_golden):
    for raw in (b"{", b"\xff", b"[]"):
        requests.post(server.url + "/v1/completions", data=raw, headers=JSON, timeout=30)
    case = stories_golden["cases"][1]
    r = server.complete({"prompt": case["prompt"], "max_tokens": case["max_tokens"],
                         "temperature": 0})
    assert r.status_code == 200
    assert r.json()["choices"][0]["text"] == case["greedy_text"]


def test_garbage_on_the_socket(server):
    """Non-HTTP bytes and a broken request line do not disturb the server."""
    for junk in (b"\x00\x01\x02\xff" * 100, b"GET\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\n"
                 b"Content-Length: -5\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            try:
                while s.recv(4096):
                    pass
            except OSError:
                pass
    assert requests.get(server.url + "/healthz", timeout=10).status_code == 200


# ---- API keys ---------------------------------------------------------------

@pytest.mark.parametrize("headers", [
    {},
    {"Authorization": "Bearer wrong-key"},
    {"Authorization": "Basic dGVzdA=="},
    {"Authorization": "Bearer"},
    {"Authorization": API_KEY},
    {"Authorization": "Bearer " + API_KEY + "x"},
])
def test_bad_api_key(auth_server, headers):
    r = requests.post(auth_server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1},
                      headers=headers, timeout=30)
    err = check_error(r, 401, None, "invalid_api_key")
    assert err["type"] == "invalid_request_error"
    r = requests.get(auth_server.url + "/v1/models", headers=headers, timeout=30)
    check_error(r, 401, None, "invalid_api_key")


def test_good_api_key(auth_server):
    h = {"Authorization": "Bearer " + API_KEY}
    r = requests.post(auth_server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1},
                      headers=h, timeout=30)
    assert r.status_code == 200, r.text
    assert requests.get(auth_server.url + "/v1/models", headers=h, timeout=30).status_code == 200
    # whitespace around the key is not part of it (RFC 9110's OWS)
    raw = raw_exchange(auth_server.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                       b"Authorization: Bearer  " + API_KEY.encode() + b" \t\r\n"
                       b"Connection: close\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
    # probes need no key
    assert requests.get(auth_server.url + "/healthz", timeout=30).status_code == 200
    assert requests.get(auth_server.url + "/livez", timeout=30).status_code == 200


def test_fuzzed_bodies_never_5xx(server):
    """Seeded random mutations of valid bodies: every answer is a 200 or a
    well-formed 4xx, never a 5xx or a dropped connection."""
    import random
    rng = random.Random(1234)
    seeds = [
        b'{"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0}',
        b'{"prompt": [1, 403, 407], "max_tokens": 2, "stop": ["a", "b"], "n": 2}',
        b'{"prompt": ["The cat", "A dog"], "max_tokens": 2, "logprobs": 2, "echo": true}',
        b'{"prompt": "x", "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}}',
    ]
    alphabet = b'{}[]":,0123456789-.eE truefalsnul\\\xff\xc3\xa9\x00'
    with requests.Session() as sess:
        for i in range(300):
            body = bytearray(rng.choice(seeds))
            for _ in range(rng.randint(1, 4)):
                op = rng.randrange(3)
                pos = rng.randrange(len(body) + 1)
                if op == 0 and body:
                    del body[min(pos, len(body) - 1)]
                elif op == 1:
                    body[pos:pos] = bytes([rng.choice(alphabet)])
                elif body:
                    body[min(pos, len(body) - 1)] = rng.choice(alphabet)
            r = sess.post(server.url + "/v1/completions", data=bytes(body), headers=JSON,
                          timeout=60)
            assert r.status_code < 500, (bytes(body), r.status_code, r.text[:300])
            if r.status_code >= 400:
                check_error(r, r.status_code)
            else:
                r.content  # drain (may be a stream)
    assert requests.get(server.url + "/healthz", timeout=30).status_code == 200


def split_answer(raw):
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return status, headers, body


@pytest.mark.parametrize("case", ["target", "headers"])
def test_request_line_and_headers_over_dolphins_limits(server, case):
    """A request target over 8 KiB is a JSON 414 and headers over 32 KiB a
    JSON 431, both in OpenAI's shape with X-Request-Id, from Dolphin itself."""
    if case == "target":
        r = requests.get(server.url + "/v1/models?pad=" + "a" * 9000, timeout=30)
        err = check_error(r, 414, code="uri_too_long")
    else:
        r = requests.get(server.url + "/v1/models", headers={"X-Pad": "a" * 40000}, timeout=30)
        err = check_error(r, 431, code="request_header_fields_too_large")
    assert err["type"] == "invalid_request_error"
    assert r.headers["Connection"].lower() == "close"
    # just under the limits the request is served
    assert requests.get(server.url + "/v1/models?pad=" + "a" * 7000, timeout=30).ok
    assert requests.get(server.url + "/v1/models", headers={"X-Pad": "a" * 30000},
                        timeout=30).ok


# libmicrohttpd answers these itself, with a small HTML page, before any of
# Dolphin's code runs (docs/openapi.yaml, docs/robustness.md): a request line
# or headers past its 256 KiB per-connection memory pool, a malformed header
# line, an HTTP version it does not speak.
MHD_ANSWERS = [
    ("target-past-pool", b"GET /v1/models?pad=" + b"a" * 300_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
     414),
    ("headers-past-pool", b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 300_000 +
     b"\r\n\r\n", 431),
    ("malformed-header-line", b"GET /v1/models HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
     400),
    ("unknown-version", b"GET /v1/models HTTP/2.5\r\nHost: x\r\n\r\n", 505),
    ("length-not-a-number", b"GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n", 400),
    ("malformed-chunked", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
     b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n{\"a\":1}", 400),
    ("length-past-counting", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
     b"18446744073709551617\r\n\r\n", 413),
]


@pytest.mark.parametrize("data,status", [c[1:] for c in MHD_ANSWERS],
                         ids=[c[0] for c in MHD_ANSWERS])
def test_libmicrohttpd_answers_are_the_documented_exception(server, data, status):
    """The one exception to JSON errors, documented in docs/openapi.yaml: the
    status is right, the connection is closed, the server keeps serving."""
    got, headers, body = split_answer(raw_exchange(server.port, data))
    assert got == status
    assert headers.get("connection", "").lower() == "close"
    # for a bad Content-Length libmicrohttpd sends its head twice (documented)
    assert body.split(b"\r\n\r\n")[-1].startswith(b"<html>"), body[:300]
    spec = yaml.safe_load((REPO / "docs" / "openapi.yaml").read_text())
    listed = {a["status"] for a in spec["info"]["x-dolphin-libmicrohttpd-answers"]["answers"]}
    assert str(status) in listed, f"{status} is not in docs/openapi.yaml's exceptions {listed}"
    assert requests.get(server.url + "/v1/models", timeout=30).ok


def test_ambiguous_body_length_is_refused(server):
    """Content-Length headers that differ (a request smuggling pattern): a JSON
    400 and the connection closed, so no leftover bytes are read as a second
    request."""
    body = b'{"prompt":"a","max_tokens":1}'
    raw = raw_exchange(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                       b"Content-Type: application/json\r\nContent-Length: 5\r\n"
                       b"Content-Length: 29\r\n\r\n" + body)
    status, headers, rest = split_answer(raw)
    assert status == 400 and headers["connection"].lower() == "close"
    assert json.loads(rest)["error"]["code"] == "ambiguous_body_length"
    assert raw.count(b"HTTP/1.1 ") == 1, raw   # nothing answered for the leftover


@pytest.mark.parametrize("coding,length", [
    (b"chunked", True), (b"identity", True), (b"gzip, chunked", False), (b"foo", False)],
    ids=["chunked-with-length", "identity-with-length", "gzip-chunked", "unknown"])
def test_unknown_transfer_coding_is_answered_at_once(server, coding, length):
    """A Transfer-Encoding other than chunked hides where the body ends: the
    answer comes from the head alone (400 beside Content-Length, else 501),
    at once, with the connection closed; the client's socket stays open, so
    a server that waited for the body would time this out."""
    body = b'{"prompt":"a","max_tokens":1}'
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: " + coding + b"\r\n" +
            (b"Content-Length: %d\r\n" % len(body) if length else b"") + b"\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head + body)
        raw = b""
        while chunk := s.recv(65536):   # to the server's close
            raw += chunk
    status, headers, rest = split_answer(raw)
    assert status == (400 if length else 501), raw[:300]
    assert headers["connection"].lower() == "close"
    code = json.loads(rest)["error"]["code"]
    assert code == ("ambiguous_body_length" if length else "unsupported_transfer_encoding")
    assert requests.get(server.url + "/v1/models", timeout=30).ok


def test_huge_announced_body_gets_413_at_once(server):
    """A Content-Length past what would be read and discarded gets the 413
    before any of the body is sent."""
    raw = raw_exchange(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                       b"Content-Type: application/json\r\nContent-Length: 99999999999\r\n\r\n",
                       head_only=True, timeout=10)
    assert raw.startswith(b"HTTP/1.1 413"), raw[:200]


def test_nul_in_the_path_is_not_cut(server):
    """%00 is not decoded: /v1/models/stories260K%00x is not stories260K."""
    r = requests.get(server.url + "/v1/models/stories260K%00x", timeout=10)
    check_error(r, 404, param="model", code="model_not_found")
    r = requests.get(server.url + "/v1/models/stories%32%36%30K", timeout=10)
    assert r.status_code == 200 and r.json()["id"] == "stories260K"


def test_lowercase_method_named_in_the_error(server):
    raw = raw_exchange(server.port, b"get /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    status, _, rest = split_answer(raw)
    assert status == 405 and "Method get is not allowed" in json.loads(rest)["error"]["message"]


@pytest.mark.parametrize("value", [9007199254740992, 1e308])
def test_too_large_integer_named_as_too_large(server, value):
    r = server.complete({"prompt": "a", "max_tokens": value})
    err = check_error(r, 400, param="max_tokens")
    assert "at most" in err["message"], err


@pytest.mark.parametrize("raw", [b'{"prompt":"a","prompt":5}',
                                 b'{"prompt":"a","logit_bias":{"5":1,"6":2,"5":3}}',
                                 b'{"messages":[{"role":"user","content":"a","role":"system"}]}'])
def test_duplicate_keys_are_refused(server, raw):
    """Parsers disagree on which of two equal keys counts (first or last):
    a body with one is ambiguous and refused."""
    path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
    r = requests.post(server.url + path, data=raw, headers=JSON, timeout=30)
    err = check_error(r, 400)
    assert "appears twice" in err["message"], err
