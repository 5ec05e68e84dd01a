"""Logs, request ids and API keys (docs/deployment.md): every log line is one
key=value event with a level; every request gets one line with its id,
route, status, token counts and timings that agree with the answer; every
response carries X-Request-Id (errors, 404, 405, 413, 415, streams, probes,
metrics); API keys answer 401 in OpenAI's shape and leave probes open."""
import json
import re
import time

import pytest
import requests

from dolphin_server import API_KEY, Dolphind, check_error, raw_exchange
from ops_util import log_records

LINE = re.compile(r'^ts=\S+ level=(debug|info|warn|error) event=[a-z_]+'
                  r'( [a-z_]+=("(?:[^"\\]|\\.)*"|[^\s"]*))*$')


@pytest.fixture(scope="module")
def dolphin():
    srv = Dolphind("stories260K", ["--api-key", API_KEY, "--api-key", "low-key:0"])
    yield srv
    srv.stop()


def auth(key=API_KEY):
    return {"Authorization": f"Bearer {key}"}


def request_line(srv, rid, timeout=10):
    deadline = time.time() + timeout
    while True:
        recs = [x for x in log_records(srv.log(), "request") if x.get("request_id") == rid]
        if recs or time.time() > deadline:
            assert len(recs) == 1, recs
            return recs[0]
        time.sleep(0.05)


def test_request_line_has_everything(dolphin):
    rid = "ops-log-1"
    r = requests.post(dolphin.url + "/v1/completions", headers={**auth(), "X-Request-Id": rid},
                      json={"prompt": ["Once", "The cat sat"], "max_tokens": 9, "n": 2},
                      timeout=60)
    assert r.status_code == 200 and r.headers["X-Request-Id"] == rid
    u = r.json()["usage"]
    rec = request_line(dolphin, rid)
    assert rec["level"] == "info" and rec["method"] == "POST"
    assert rec["route"] == "/v1/completions" and rec["status"] == "200"
    assert int(rec["prompt_tokens"]) == u["prompt_tokens"]
    assert int(rec["completion_tokens"]) == u["completion_tokens"]
    q, ttft, total = float(rec["queue_ms"]), float(rec["ttft_ms"]), float(rec["total_ms"])
    assert 0 <= q <= ttft <= total, rec
    assert ttft > 0


def test_stream_line(dolphin):
    rid = "ops-log-stream"
    with requests.post(dolphin.url + "/v1/completions", headers={**auth(), "X-Request-Id": rid},
                       json={"prompt": "Once", "max_tokens": 6, "stream": True},
                       stream=True, timeout=60) as r:
        assert r.headers["X-Request-Id"] == rid
        r.content
    rec = request_line(dolphin, rid)
    assert rec["status"] == "200" and rec["completion_tokens"] == "6" and float(rec["ttft_ms"]) > 0


@pytest.mark.parametrize("method,path,body,headers,status", [
    ("GET", "/nope", None, {}, 404),
    ("DELETE", "/v1/completions", None, {}, 405),
    ("POST", "/v1/completions", "{}", {"Content-Type": "text/plain"}, 415),
    ("POST", "/v1/completions", "{not json", {"Content-Type": "application/json"}, 400),
    ("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": -3}),
     {"Content-Type": "application/json"}, 400),
    ("POST", "/v1/completions", "x" * (1 << 20 | 1), {"Content-Type": "application/json"}, 413),
])
def test_every_error_has_an_id_and_a_line(dolphin, method, path, body, headers, status):
    rid = f"ops-err-{status}-{method.lower()}-{len(body or '')}"
    r = requests.request(method, dolphin.url + path, data=body, timeout=60,
                         headers={**auth(), "X-Request-Id": rid, **headers})
    check_error(r, status)
    assert r.headers["X-Request-Id"] == rid
    rec = request_line(dolphin, rid)
    assert rec["status"] == str(status) and rec["level"] == "info"


def test_413_with_expect_100_continue(dolphin):
    """A client that waits for "100 Continue" gets the 413 (with the id) before
    sending the body."""
    data = raw_exchange(dolphin.port,
                        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"X-Request-Id: ops-expect-413\r\nExpect: 100-continue\r\n"
                        b"Content-Length: 5000000\r\n\r\n", head_only=True, timeout=30)
    head = data.split(b"\r\n\r\n")[0].decode()
    assert head.startswith("HTTP/1.1 413"), head
    assert "X-Request-Id: ops-expect-413" in head


def test_api_keys(dolphin):
    body = {"prompt": "Once", "max_tokens": 2}
    for hdr in ({}, auth("wrong"), {"Authorization": "Basic abc"}, {"Authorization": "Bearer"}):
        r = requests.post(dolphin.url + "/v1/completions", json=body, headers=hdr, timeout=60)
        err = check_error(r, 401)
        assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
        assert r.headers["WWW-Authenticate"] == "Bearer"
    for key in (API_KEY, "low-key"):
        r = requests.post(dolphin.url + "/v1/completions", json=body, headers=auth(key), timeout=60)
        assert r.status_code == 200
    assert requests.get(dolphin.url + "/v1/models", timeout=60).status_code == 401
    assert requests.get(dolphin.url + "/v1/models", headers=auth(), timeout=60).status_code == 200
    for path in ("/healthz", "/livez", "/metrics"):
        r = requests.get(dolphin.url + path, timeout=60)
        assert r.status_code == 200 and r.headers["X-Request-Id"], path
    # the key never reaches the log
    assert API_KEY not in dolphin.log()


def test_every_log_line_is_key_value(dolphin):
    requests.get(dolphin.url + "/healthz", timeout=30)
    lines = [ln for ln in dolphin.log().splitlines() if ln.strip()]
    assert len(lines) > 10
    bad = [ln for ln in lines if not LINE.match(ln)]
    assert not bad, bad[:5]
    recs = log_records(dolphin.log())
    events = {x["event"] for x in recs}
    assert {"listening", "model_loaded", "warmed_up", "ready", "request"} <= events


def test_probes_log_at_debug_only():
    """Successful probes and scrapes (every few seconds in production) are
    logged at debug level, so they are absent at the default level and
    present with --log-level debug."""
    quiet = Dolphind("stories260K")
    loud = Dolphind("stories260K", ["--log-level", "debug"])
    try:
        for srv in (quiet, loud):
            for path in ("/healthz", "/livez", "/metrics"):
                requests.get(srv.url + path, headers={"X-Request-Id": "probe-" + path[1:]},
                             timeout=30)
        time.sleep(0.3)
        quiet_ids = {x.get("request_id") for x in log_records(quiet.log(), "request")}
        assert not quiet_ids & {"probe-healthz", "probe-livez", "probe-metrics"}
        loud_recs = [x for x in log_records(loud.log(), "request")
                     if x.get("request_id", "").startswith("probe-")]
        assert {x["request_id"] for x in loud_recs} == {"probe-healthz", "probe-livez",
                                                        "probe-metrics"}
        assert all(x["level"] == "debug" for x in loud_recs)
    finally:
        quiet.stop()
        loud.stop()
