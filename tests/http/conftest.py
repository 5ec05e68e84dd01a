"""Fixtures for the HTTP tests: start build/dolphind on a free port with a
test model, wait for /healthz, hand out the base URL, stop it with SIGTERM.

Environment: DOLPHIN_BIN (default <repo>/build/dolphind) and DOLPHIN_SHARED
(default <repo>/../shared, which holds models/ and golden/).
"""
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

API_KEY = "test-key-0123456789"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, proc, port, log_path, model_dir):
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.model_dir = model_dir

    def log(self):
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def post(self, path, body, **kw):
        kw.setdefault("timeout", 120)
        return requests.post(self.url + path, json=body, **kw)

    def complete(self, body, **kw):
        return self.post("/v1/completions", body, **kw)


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


def start_server(name, extra=()):
    if not BIN.is_file():
        pytest.skip(f"{BIN} not built (set DOLPHIN_BIN)")
    d = model_dir(name)
    port = free_port()
    fd, log_path = tempfile.mkstemp(prefix=f"dolphind-{name}-", suffix=".log")
    cmd = [str(BIN), "--model", str(d), "--host", "127.0.0.1", "--port", str(port),
           "--threads", "2", *extra]
    proc = subprocess.Popen(cmd, stdout=fd, stderr=fd)
    os.close(fd)
    srv = Server(proc, port, log_path, d)
    deadline = time.time() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail(f"dolphind exited with {proc.returncode} during start-up:\n{srv.log()}")
        try:
            if requests.get(srv.url + "/healthz", timeout=2).status_code == 200:
                return srv
        except requests.RequestException:
            pass
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"dolphind not ready within 60 s:\n{srv.log()}")
        time.sleep(0.1)


def stop_server(srv):
    srv.proc.send_signal(signal.SIGTERM)
    try:
        rc = srv.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        srv.proc.wait()
        pytest.fail(f"dolphind did not exit within 60 s of SIGTERM:\n{srv.log()[-4000:]}")
    log = srv.log()
    bad = [m for m in ("AddressSanitizer", "runtime error:", "LeakSanitizer",
                       "Fatal error in GNU libmicrohttpd") if m in log]
    assert not bad and rc == 0, f"dolphind exit {rc}, {bad}:\n{log[-6000:]}"
    os.unlink(srv.log_path)


@pytest.fixture(scope="session")
def server():
    srv = start_server("stories260K")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def tiny_server():
    srv = start_server("tiny-llama2")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def auth_server():
    srv = start_server("stories260K", ["--api-key", API_KEY])
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def stories_golden():
    return golden("stories260K")


@pytest.fixture(scope="session")
def tiny_golden():
    return golden("tiny-llama2")


def read_sse(resp):
    """Read a whole SSE response: returns (list of parsed JSON events, saw_done).
    Every event must be a `data: ...` line followed by a blank line."""
    raw = b"".join(resp.iter_content(chunk_size=None))
    text = raw.decode("utf-8")
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


def stream_text(events, n_choices=1):
    """Concatenate the streamed text per choice index."""
    out = [""] * n_choices
    for ev in events:
        for ch in ev.get("choices", []):
            out[ch["index"]] += ch["text"]
    return out


def assert_error_shape(resp, status, param=None, code=None):
    assert resp.status_code == status, f"want {status}, got {resp.status_code}: {resp.text[:300]}"
    assert resp.headers.get("Content-Type", "").startswith("application/json")
    assert resp.headers.get("X-Request-Id")
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err.get("message"), str) and err["message"]
    assert isinstance(err.get("type"), str) and err["type"]
    assert "param" in err and "code" in err
    assert err["param"] is None or isinstance(err["param"], str)
    assert err["code"] is None or isinstance(err["code"], str)
    if param is not None:
        assert err["param"] == param, err
        assert param.split(".")[-1] in err["message"], err
    if code is not None:
        assert err["code"] == code, err
    return err
