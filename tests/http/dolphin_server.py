"""Helpers for HTTP tests that need their own dolphind (own flags, own
model): start one on a free loopback port, wait until /healthz is 200, read
its scheduler figures, talk to it over plain sockets (to hang up on purpose),
stop it with SIGTERM and check it exited cleanly.

Standalone on purpose (tests/http/conftest.py belongs to the golden tests):
the same environment variables and defaults as conftest.py —
DOLPHIN_BIN (default <repo>/build/dolphind) and DOLPHIN_SHARED (default
<repo>/../shared, holding models/ and golden/).
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("DOLPHIN_BIN", REPO / "build" / "dolphind"))
SHARED = Path(os.environ.get("DOLPHIN_SHARED", REPO.parent / "shared"))

# Generous limits: the suite must pass on a loaded 2-core machine.
START_TIMEOUT_S = 90
HTTP_TIMEOUT_S = 180


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_dir(name):
    d = SHARED / "models" / name
    if not d.is_dir():
        pytest.skip(f"test model {d} not found (set DOLPHIN_SHARED to the shared fixtures)")
    return d


def golden(name):
    p = SHARED / "golden" / f"{name}.json"
    if not p.is_file():
        pytest.skip(f"golden file {p} not found (set DOLPHIN_SHARED)")
    return json.loads(p.read_text())


class Dolphind:
    """One running dolphind. `args` are the extra command-line flags."""

    def __init__(self, model, args=(), threads=2, api_key=None):
        if not BIN.is_file():
            pytest.skip(f"{BIN} not built (set DOLPHIN_BIN)")
        self.model = model
        self.dir = model_dir(model)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key  # sent by default when set
        fd, self.log_path = tempfile.mkstemp(prefix=f"dolphind-sched-{model}-", suffix=".log")
        self.cmd = [str(BIN), "--model", str(self.dir), "--host", "127.0.0.1",
                    "--port", str(self.port), "--threads", str(threads), *map(str, args)]
        self.proc = subprocess.Popen(self.cmd, stdout=fd, stderr=fd)
        os.close(fd)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"dolphind exited with {self.proc.returncode} during start-up "
                            f"({' '.join(self.cmd)}):\n{self.log()}")
            try:
                if requests.get(self.url + "/healthz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                pytest.fail(f"dolphind not ready within {START_TIMEOUT_S} s:\n{self.log()}")
            time.sleep(0.05)

    # ---- process -----------------------------------------------------------
    def log(self):
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"dolphind did not exit within 90 s of SIGTERM:\n{self.log()[-4000:]}")
        log = self.log()
        bad = [m for m in ("AddressSanitizer", "runtime error:", "LeakSanitizer",
                           "Fatal error in GNU libmicrohttpd") if m in log]
        assert not bad and rc == 0, f"dolphind exit {rc}, {bad}:\n{log[-6000:]}"
        os.unlink(self.log_path)

    # ---- HTTP --------------------------------------------------------------
    def headers(self, key=None):
        key = key or self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def complete(self, body, key=None, timeout=HTTP_TIMEOUT_S, **kw):
        return requests.post(self.url + "/v1/completions", json=body, headers=self.headers(key),
                             timeout=timeout, **kw)

    def health(self):
        r = requests.get(self.url + "/healthz", timeout=30)
        return r.json()

    def sched(self):
        """(scheduler figures, kv_cache figures) from /healthz."""
        h = self.health()
        return h["scheduler"], h["kv_cache"]

    def wait_for(self, pred, timeout, what, interval=0.01):
        """Poll /healthz until pred(health) holds; return that health JSON."""
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if pred(h):
                return h
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; "
                                     f"last /healthz: {h}")
            time.sleep(interval)

    def wait_idle(self, timeout=30):
        """Nothing queued or running and every KV block back in the pool."""
        return self.wait_for(
            lambda h: h["kv_cache"]["blocks_used"] == 0 and h["scheduler"]["running_seqs"] == 0
            and h["scheduler"]["queued"] == 0 and h["scheduler"]["running_requests"] == 0,
            timeout, "an idle scheduler (blocks_used == 0, nothing running or queued)")

    def open_raw(self, body, key=None):
        """Send a POST /v1/completions on a plain socket and return it, without
        reading the answer (the caller hangs up or reads with read_raw)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=HTTP_TIMEOUT_S)
        data = json.dumps(body).encode()
        hdr = {"Content-Type": "application/json", **self.headers(key)}
        conn.request("POST", "/v1/completions", body=data, headers=hdr)
        return conn


def hang_up(conn):
    """Close a client connection at once (FIN; the server must notice)."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    conn.close()


def parse_sse(text):
    """(events as parsed JSON, saw [DONE]) from a whole SSE body."""
    assert text.endswith("\n\n"), f"stream does not end with a blank line: {text[-200:]!r}"
    events, done = [], False
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), f"bad SSE block {block!r}"
        payload = block[len("data: "):]
        assert not done, "event after [DONE]"
        if payload == "[DONE]":
            done = True
            continue
        events.append(json.loads(payload))
    return events, done


def stream_texts(events, n_choices=1):
    out = [""] * n_choices
    for ev in events:
        for ch in ev.get("choices", []):
            out[ch["index"]] += ch["text"]
    return out


def check_error(resp, status, type_=None, code=None):
    """An OpenAI-shaped JSON error with the given status; returns error{}."""
    assert resp.status_code == status, f"want {status}, got {resp.status_code}: {resp.text[:300]}"
    assert resp.headers.get("Content-Type", "").startswith("application/json"), resp.headers
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err
    if type_ is not None:
        assert err["type"] == type_, err
    if code is not None:
        assert err["code"] == code, err
    return err
