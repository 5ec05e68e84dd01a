"""dolphind behind a real nginx running configs/nginx/dolphin.conf (only the
upstream port, the listen address and the access log path changed): streams
arrive chunk by chunk, non-streamed answers are identical to the direct
ones, the body limit matches dolphind's to the byte, X-Request-Id goes
through both ways and nginx's own errors keep OpenAI's shape."""
import re
import time

import pytest
import requests
import yaml

from dolphin_server import Dolphind, parse_sse
from ops_util import (CONFIGS, log_records, nginx_in_front, timed_stream,
                      upstream_sockets)

# stories260K: 512 positions. 480 greedy tokens take ~0.2 s in a release
# build and a few seconds with sanitizers: long enough to see the stream
# spread out in time either way.
LONG_STREAM = {"prompt": "Once upon a time", "max_tokens": 480, "temperature": 0,
               "ignore_eos": True, "stream": True}
MIB = 1 << 20


@pytest.fixture(scope="module")
def dolphin():
    srv = Dolphind("stories260K")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def proxy(dolphin):
    with nginx_in_front(dolphin.port) as ng:
        yield ng


def test_stream_arrives_chunk_by_chunk(dolphin, proxy):
    status, headers, arrivals = timed_stream(proxy.url, LONG_STREAM)
    assert status == 200, proxy.error_log()
    assert headers["Content-Type"].startswith("text/event-stream")
    raw = b"".join(c for _, c in arrivals)
    events, done = parse_sse(raw)
    assert done
    text = "".join(ev["choices"][0]["text"] for ev in events if ev.get("choices"))
    # nginx passed the events on as they came: many separate reads, the
    # first one early, not one burst at the end
    first, last = arrivals[0][0], arrivals[-1][0]
    assert len(arrivals) >= 20, f"only {len(arrivals)} reads: nginx buffered the stream"
    assert first < 0.5 * last, f"first chunk at {first:.3f} s, last at {last:.3f} s"
    before_half = sum(1 for t, _ in arrivals if t < last / 2)
    assert before_half >= 5, f"only {before_half} reads in the first half of the stream"
    # the same text as straight from dolphind
    _, _, direct = timed_stream(dolphin.url, LONG_STREAM)
    d_events, d_done = parse_sse(b"".join(c for _, c in direct))
    assert d_done
    assert text == "".join(ev["choices"][0]["text"] for ev in d_events if ev.get("choices"))


def test_upstream_keepalive(dolphin, proxy):
    """nginx keeps its connection to dolphind open between requests and
    reuses it (upstream keepalive), instead of one connection per request."""
    body = {"prompt": "Once", "max_tokens": 2}
    for _ in range(3):
        assert requests.post(proxy.url + "/v1/completions", json=body, timeout=60).status_code == 200
    first = upstream_sockets(proxy.proc.pid, dolphin.port)
    assert first, "no idle upstream connection kept open"
    for _ in range(5):
        assert requests.post(proxy.url + "/v1/completions", json=body, timeout=60).status_code == 200
    again = upstream_sockets(proxy.proc.pid, dolphin.port)
    assert first & again, f"connections not reused: {first} then {again}"
    assert len(again) <= 2, again    # sequential requests need one connection


def test_non_streamed_identical_to_direct(dolphin, proxy):
    body = {"prompt": ["Once upon a time", "The dog"], "max_tokens": 40, "temperature": 0,
            "logprobs": 2}
    via = requests.post(proxy.url + "/v1/completions", json=body, timeout=120)
    direct = requests.post(dolphin.url + "/v1/completions", json=body, timeout=120)
    assert via.status_code == direct.status_code == 200
    assert via.headers["Content-Type"] == direct.headers["Content-Type"]
    a, b = via.json(), direct.json()
    for k in ("id", "created"):   # differ per request by design
        a.pop(k)
        b.pop(k)
    assert a == b


def _padded_body(size):
    """A valid completion request of exactly `size` bytes (JSON + spaces)."""
    core = b'{"prompt": "Once", "max_tokens": 1, "temperature": 0}'
    return core[:-1] + b" " * (size - len(core)) + b"}"


def test_body_limit_matches_dolphind(dolphin, proxy):
    """client_max_body_size in the nginx site = max_body_bytes (1MiB by
    default): a body of exactly the limit passes both, one byte more gets
    413 from both, in OpenAI's JSON shape, with an X-Request-Id."""
    conf = (CONFIGS / "nginx" / "dolphin.conf").read_text()
    m = re.search(r"^\s*client_max_body_size\s+(\d+)([kKmMgG]?);", conf, re.M)
    assert m, "client_max_body_size missing from configs/nginx/dolphin.conf"
    nginx_limit = int(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    default = yaml.safe_load((CONFIGS / "dolphin.yaml").read_text())["max_body_bytes"]
    assert default == "1MiB" and nginx_limit == MIB

    hdr = {"Content-Type": "application/json"}
    for url in (proxy.url, dolphin.url):
        ok = requests.post(url + "/v1/completions", data=_padded_body(MIB), headers=hdr, timeout=60)
        assert ok.status_code == 200, (url, ok.text[:300])
        big = requests.post(url + "/v1/completions", data=_padded_body(MIB + 1), headers=hdr,
                            timeout=60)
        assert big.status_code == 413, (url, big.status_code, big.text[:300])
        assert big.headers["Content-Type"].startswith("application/json")
        assert big.headers.get("X-Request-Id")
        err = big.json()["error"]
        assert err["code"] == "request_too_large" and err["type"] == "invalid_request_error"
        assert str(MIB) in err["message"]


def test_request_id_through_nginx(dolphin, proxy):
    # the client's id: echoed, and in dolphind's log line of the request
    r = requests.post(proxy.url + "/v1/completions", json={"prompt": "Once", "max_tokens": 2},
                      headers={"X-Request-Id": "via-nginx-42"}, timeout=60)
    # (a header sent twice would read "via-nginx-42, via-nginx-42")
    assert r.status_code == 200 and r.headers["X-Request-Id"] == "via-nginx-42"
    # an id dolphind would refuse is replaced by nginx's own, which dolphind
    # then uses too: the same id in the answer, dolphind's log and nginx's log
    r = requests.post(proxy.url + "/v1/completions", json={"prompt": "Once", "max_tokens": 2},
                      headers={"X-Request-Id": "has space;semi"}, timeout=60)
    rid = r.headers["X-Request-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid), rid
    deadline = time.time() + 10
    while time.time() < deadline:
        ours = [x for x in log_records(dolphin.log(), "request") if x.get("request_id") in
                ("via-nginx-42", rid)]
        theirs = [x for x in log_records(proxy.access_log(), "nginx_request")
                  if x.get("request_id") in ("via-nginx-42", rid)]
        if len(ours) == 2 and len(theirs) == 2:
            break
        time.sleep(0.05)
    assert len(ours) == 2, ours
    assert len(theirs) == 2, proxy.access_log()[-2000:]


def test_streaming_headers_and_errors_pass_through(dolphin, proxy):
    r = requests.post(proxy.url + "/v1/completions", json={"prompt": "Once", "max_tokens": -1},
                      timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_tokens"
    r = requests.get(proxy.url + "/nope", timeout=60)
    assert r.status_code == 404 and r.headers["X-Request-Id"]
    r = requests.get(proxy.url + "/healthz", timeout=60)
    assert r.status_code == 200 and r.json()["ready"] is True


def test_metrics_only_from_private_addresses(proxy):
    r = requests.get(proxy.url + "/metrics", timeout=60)   # 127.0.0.1 is allowed
    assert r.status_code == 200 and "dolphin_requests_total" in r.text


def test_upstream_down_is_json_502():
    """nginx with no dolphind behind it: 502 in OpenAI's shape, with an id."""
    from ops_util import free_port
    with nginx_in_front(free_port()) as ng:
        r = requests.post(ng.url + "/v1/completions", json={"prompt": "x"}, timeout=60)
        assert r.status_code == 502
        assert r.headers["Content-Type"].startswith("application/json")
        assert r.headers.get("X-Request-Id") and r.headers.get("Retry-After") == "1"
        assert r.json()["error"]["type"] == "service_unavailable"


def test_site_directives():
    """What the streaming and keepalive tests rely on, spelled out in the site
    (dolphind's "X-Accel-Buffering: no" alone also stops nginx buffering a
    stream, but a proxy_ignore_headers elsewhere would undo that)."""
    conf = (CONFIGS / "nginx" / "dolphin.conf").read_text()
    loc = conf[conf.index("location / {"):]
    loc = loc[: loc.index("\n    }")]
    for directive in ("proxy_buffering off;", "proxy_cache off;", "proxy_http_version 1.1;",
                      'proxy_set_header Connection "";',
                      "proxy_set_header X-Request-Id $dolphin_request_id;"):
        assert directive in loc, directive
    m = re.search(r"proxy_read_timeout (\d+)s;", loc)
    assert m and int(m.group(1)) >= 300, "a long proxy_read_timeout for streams"
    assert re.search(r"^\s*keepalive \d+;", conf, re.M), "upstream keepalive"
    # nginx drops idle upstream connections before dolphind does
    idle = int(re.search(r"^\s*keepalive_timeout (\d+)s;", conf, re.M).group(1))
    settings = yaml.safe_load((CONFIGS / "dolphin.yaml").read_text())
    assert idle < settings.get("connection_timeout_s", 300)
    assert settings.get("max_connections_per_ip", 0) == 0   # all of nginx is one address


def test_replica_directives():
    """The N-replica choices docs/deployment.md explains: least_conn and
    max_fails/fail_timeout in both upstreams, whose server lists are equal;
    retries only on connect errors (never non_idempotent, never timeout)
    and on dolphind's 503 through @dolphin_retry; streaming kept there."""
    conf = (CONFIGS / "nginx" / "dolphin.conf").read_text()
    ups = dict(re.findall(r"^upstream (\w+) \{(.*?)^\}", conf, re.M | re.S))
    assert set(ups) == {"dolphind", "dolphind_retry"}
    lists = []
    for name, body in ups.items():
        assert re.search(r"^\s*least_conn;", body, re.M), name
        servers = re.findall(r"^\s*server (\S+) (.*);", body, re.M)
        assert len(servers) >= 2, name
        for _, params in servers:
            assert re.search(r"max_fails=\d+", params) and re.search(r"fail_timeout=\d+s", params)
        lists.append(servers)
    assert lists[0] == lists[1]
    assert "keepalive" not in ups["dolphind_retry"]     # fresh connects: refused when draining
    nexts = re.findall(r"^\s*proxy_next_upstream (.*);", conf, re.M)
    assert nexts and all(n.split() == ["error"] for n in nexts), nexts
    loc = conf[conf.index("location / {"):]
    loc = loc[: loc.index("\n    }")]
    assert "proxy_intercept_errors on;" in loc and "error_page 503 = @dolphin_retry;" in loc
    retry = conf[conf.index("location @dolphin_retry {"):]
    retry = retry[: retry.index("\n    }")]
    assert "proxy_pass http://dolphind_retry;" in retry
    assert "proxy_intercept_errors" not in retry        # a second 503 goes to the client
    for directive in ("proxy_buffering off;", "proxy_cache off;", "proxy_http_version 1.1;",
                      "proxy_set_header X-Request-Id $dolphin_request_id;"):
        assert directive in retry, directive
