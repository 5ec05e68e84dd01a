"""Graceful shutdown (docs/deployment.md): with a long stream in flight, SIGTERM (or
SIGINT) stops listening at once (a new connection is refused) and, on
connections kept open from before, turns /healthz 503 and answers new work
503 with Connection: close; /livez still answers, the stream runs to its
natural end, and dolphind exits 0 as soon as it is done, well within
drain_timeout_s. A second signal cuts the drain short. Warm-up happens
before readiness. Each test runs its own server."""
import http.client
import json
import signal
import socket
import subprocess
import threading
import time

import pytest
import requests

from dolphin_server import BIN, Dolphind, free_port, model_dir, parse_sse
from ops_util import log_records

# stories260K: 512 positions. 480 greedy tokens with usage at the end: a
# few seconds with sanitizers, a fraction of a second in a release build.
STREAM = {"prompt": "Once upon a time", "max_tokens": 480, "temperature": 0,
          "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


class Stream(threading.Thread):
    """A streamed completion read in the background; `first` is set once
    the first event is in, `gate` (when cleared) pauses the reading."""

    def __init__(self, url, body):
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.first = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.raw, self.status, self.error = b"", None, None

    def run(self):
        try:
            with requests.post(self.url + "/v1/completions", json=self.body, stream=True,
                               timeout=120) as r:
                self.status = r.status_code
                for chunk in r.iter_content(chunk_size=None):
                    self.raw += chunk
                    self.first.set()
                    self.gate.wait()
        except requests.RequestException as e:
            self.error = e
        finally:
            self.first.set()


def kept_alive(srv):
    """An open connection that has served one request already."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    assert get(conn, "/livez")[0] == 200
    return conn


def get(conn, path):
    conn.request("GET", path)
    r = conn.getresponse()
    return r.status, r, r.read()


def wait_exit(srv, timeout):
    try:
        return srv.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        srv.proc.wait()
        pytest.fail(f"dolphind did not exit within {timeout} s:\n{srv.log()[-4000:]}")


def assert_clean_exit(srv, rc):
    log = srv.log()
    bad = [m for m in ("AddressSanitizer", "runtime error:", "LeakSanitizer") if m in log]
    assert rc == 0 and not bad, f"exit {rc} {bad}:\n{log[-4000:]}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_drains_stream_then_exits_0(sig):
    srv = Dolphind("stories260K", ["--drain-timeout-s", "60"])
    try:
        s = Stream(srv.url, STREAM)
        s.gate.clear()          # hold the stream open (not reading) for now
        s.start()
        assert s.first.wait(60) and s.status == 200, s.error
        # connections a proxy or a prober keeps open from before the signal
        probe, work = kept_alive(srv), kept_alive(srv)
        t_sig = time.monotonic()
        srv.proc.send_signal(sig)

        # readiness goes 503 at once, with the reason
        status = None
        while time.monotonic() - t_sig < 5:
            status, headers, body = get(probe, "/healthz")
            if status == 503:
                break
            time.sleep(0.005)
        assert status == 503, body
        h = json.loads(body)
        assert h["status"] == "draining" and h["state"] == "draining" and not h["ready"]
        assert any("draining" in x for x in h["reasons"])
        # no longer listening: a new connection is refused
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", srv.port), timeout=5).close()
        # new work on a kept connection: 503 in OpenAI's shape, with
        # Retry-After, and the connection is closed after it
        work.request("POST", "/v1/completions", body=b'{"prompt": "a", "max_tokens": 1}',
                     headers={"Content-Type": "application/json"})
        r = work.getresponse()
        err = json.loads(r.read())["error"]
        assert r.status == 503 and err["type"] == "service_unavailable", err
        assert err["code"] == "server_draining"
        assert r.getheader("Retry-After") and r.getheader("X-Request-Id")
        assert r.getheader("Connection") == "close"
        # still alive, and the metrics say draining (the probe connection stays open)
        assert get(probe, "/livez")[0] == 200
        m = get(probe, "/metrics")[2].decode()
        assert "\ndolphin_draining 1\n" in m and "\ndolphin_ready 0\n" in m
        assert srv.proc.poll() is None, "exited with a stream still open"

        # the stream runs to its natural end
        s.gate.set()
        s.join(120)
        assert not s.is_alive() and s.error is None, s.error
        events, done = parse_sse(s.raw)
        assert done
        assert events[-1]["usage"]["completion_tokens"] == 480
        finishes = [c["finish_reason"] for ev in events for c in ev.get("choices", [])
                    if c.get("finish_reason")]
        assert finishes == ["length"]
        assert not any("error" in ev for ev in events)

        # then dolphind exits 0 promptly (not at the 60 s drain timeout)
        rc = wait_exit(srv, 30)
        assert time.monotonic() - t_sig < 45
        assert_clean_exit(srv, rc)
        with pytest.raises(requests.ConnectionError):
            requests.post(srv.url + "/v1/completions", json={"prompt": "a"}, timeout=10)
        recs = log_records(srv.log())
        drain = [x for x in recs if x.get("event") == "draining"]
        stopped = [x for x in recs if x.get("event") == "stopped"]
        assert drain and drain[0]["signal"] == sig.name and drain[0]["inflight"] == "1"
        assert stopped and stopped[0]["unfinished_requests"] == "0"
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()


def test_drain_timeout_ends_what_is_left():
    """A stream that cannot finish within drain_timeout_s ends with an error
    event and [DONE]; the process still exits 0, soon after the timeout."""
    srv = Dolphind("stories260K", ["--drain-timeout-s", "0.5"])
    try:
        body = dict(STREAM, n=8, temperature=0.8)    # 8 x 480 tokens: seconds, even in release
        s = Stream(srv.url, body)
        s.start()
        assert s.first.wait(60) and s.status == 200
        t_sig = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        rc = wait_exit(srv, 30)
        took = time.monotonic() - t_sig
        assert_clean_exit(srv, rc)
        s.join(30)
        events, done = parse_sse(s.raw)
        lengths = [c for ev in events for c in ev.get("choices", [])
                   if c.get("finish_reason") == "length"]
        if len(lengths) < 8:    # cut off (the usual case): an error event, then [DONE]
            assert done and events[-1].get("error", {}).get("type") == "service_unavailable", \
                s.raw[-500:]
            assert any(x.get("event") == "drain_timeout" for x in log_records(srv.log()))
        assert took < 10, took
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()


def test_second_signal_cuts_the_drain_short():
    srv = Dolphind("stories260K", ["--drain-timeout-s", "120"])
    try:
        s = Stream(srv.url, dict(STREAM, n=8, temperature=0.8))
        s.start()
        assert s.first.wait(60) and s.status == 200
        t_sig = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        srv.proc.send_signal(signal.SIGINT)
        rc = wait_exit(srv, 30)
        assert time.monotonic() - t_sig < 20       # not the 120 s drain timeout
        assert_clean_exit(srv, rc)
        s.join(30)
        recs = log_records(srv.log())
        finished = b'"finish_reason":"length"' in s.raw and s.raw.count(b'"finish_reason":"length"') == 8
        assert finished or any(x.get("event") == "drain_cut_short" for x in recs)
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()


def test_warm_up_before_ready():
    """The log shows load, then warm-up, then ready, in that order, and
    nothing was served before ready."""
    srv = Dolphind("stories260K")
    try:
        events = [x.get("event") for x in log_records(srv.log())]
        assert events.index("model_loaded") < events.index("warmed_up") < events.index("ready")
        w = [x for x in log_records(srv.log()) if x.get("event") == "warmed_up"][0]
        assert "single" in w["shapes"].split(",") and "batch" in w["shapes"].split(",")
        # warm-up requests do not show up as HTTP traffic
        m = requests.get(srv.url + "/metrics", timeout=10).text
        assert "dolphin_generation_tokens_total 0\n" in m
    finally:
        srv.stop()


def test_healthz_and_requests_while_warming():
    """During the warm-up /healthz says 503 "warming" and requests get 503
    model_warming; before it "loading", after it 200 "ready". A batch of 256
    sequences makes the warm-up long enough to watch."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(BIN), "--model", str(model_dir("tiny-llama2")), "--host",
                             "127.0.0.1", "--port", str(port), "--threads", "2",
                             "--max-batch-size", "256"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen, codes = [], set()
    try:
        deadline = time.monotonic() + 120
        with requests.Session() as s:
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    h = s.get(url + "/healthz", timeout=5)
                except requests.RequestException:
                    time.sleep(0.005)
                    continue
                status = h.json()["status"]
                if not seen or seen[-1] != status:
                    seen.append(status)
                if status == "warming":
                    r = s.post(url + "/v1/completions", json={"prompt": "Once", "max_tokens": 1},
                               timeout=5)
                    codes.add((r.status_code, r.json()["error"]["code"] if r.status_code != 200
                               else None))
                if h.status_code == 200:
                    break
        assert seen[-1] == "ready", seen
        assert "warming" in seen and seen.index("warming") < seen.index("ready"), seen
        assert set(seen) <= {"loading", "warming", "ready"}, seen
        # a request that raced the end of the warm-up may have been served
        assert (503, "model_warming") in codes, codes
        assert codes <= {(503, "model_warming"), (200, None)}, codes
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def test_no_warmup_flag_still_ready():
    srv = Dolphind("stories260K", ["--no-warmup"])
    try:
        events = [x.get("event") for x in log_records(srv.log())]
        assert "warmed_up" not in events and "ready" in events
        r = requests.post(srv.url + "/v1/completions", json={"prompt": "Once", "max_tokens": 3},
                          timeout=30)
        assert r.status_code == 200
    finally:
        srv.stop()
