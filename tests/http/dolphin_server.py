"""The test harness of every Python test (tests/http, the openai client
suite, schemathesis, tests/soak): one dolphind launcher, one SSE parser, one
check of OpenAI's error shape, one free_port.

Dolphind starts build/dolphind on a free loopback port with a test model and
its own flags, waits until /healthz is 200, talks to it (JSON, raw sockets to
hang up on purpose, its scheduler figures), and stops it with SIGTERM,
checking that it exited 0 with no sanitizer report in its log.

Environment: DOLPHIN_BIN (default <repo>/build/dolphind) and DOLPHIN_SHARED
(default <repo>/../shared, holding models/ and golden/).
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
API_KEY = "test-key-0123456789"

# Generous limits: the suite must pass on a loaded 2-core machine.
START_TIMEOUT_S = 90
HTTP_TIMEOUT_S = 180
SANITIZER_MARKS = ("AddressSanitizer", "runtime error:", "LeakSanitizer",
                   "Fatal error in GNU libmicrohttpd")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_dir(name):
    d = SHARED / "models" / name
    if not d.is_dir():
        pytest.skip(f"test model {d} not found (set DOLPHIN_SHARED to the shared fixtures)")
    return d


def gguf_file(name):
    """The shared GGUF fixture models/gguf/<name> (skips when absent)."""
    p = SHARED / "models" / "gguf" / name
    if not p.is_file():
        pytest.skip(f"test model {p} not found (set DOLPHIN_SHARED to the shared fixtures)")
    return p


def golden(name):
    p = SHARED / "golden" / f"{name}.json"
    if not p.is_file():
        pytest.skip(f"golden file {p} not found (set DOLPHIN_SHARED)")
    return json.loads(p.read_text())


def pin_exact_activations(args):
    """Whether a server started with `args` gets --activations f32: the
    exact products, which the goldens are made for (the default runs 8-bit
    activations on quantized weights where the CPU has the kernels). Not
    when the flags or the --config file choose themselves."""
    if any(a.startswith("--activations") for a in args):
        return False
    for i, a in enumerate(args[:-1]):
        if a == "--config" and "activations" in Path(args[i + 1]).read_text(errors="replace"):
            return False
    return True


class Dolphind:
    """One running dolphind on `model` (a test model's name, a model
    directory or a .gguf file; None when `args` name a --config file with a models list)
    with the extra flags `args`, from `binary` (default BIN). With
    `api_key` set, its requests send that key unless told otherwise. `port`
    (default: a free one) lets a restarted replica keep its address."""

    def __init__(self, model, args=(), threads=2, api_key=None, binary=None, port=None):
        binary = Path(binary or BIN)
        if not binary.is_file():
            pytest.skip(f"{binary} not built (set DOLPHIN_BIN)")
        if model is None:
            self.model_dir, self.model, model_args = None, "models", []
        elif Path(model).suffix == ".gguf" and Path(model).is_file():
            # one GGUF file: the model id is its name without .gguf
            self.model_dir, self.model = Path(model), Path(model).stem
            model_args = ["--model", str(self.model_dir)]
        else:
            self.model_dir = Path(model) if Path(model).is_dir() else model_dir(model)
            self.model = self.model_dir.name
            model_args = ["--model", str(self.model_dir)]
        args = [*map(str, args)]
        if pin_exact_activations(args):
            args += ["--activations", "f32"]
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        fd, self.log_path = tempfile.mkstemp(prefix=f"dolphind-{self.model}-", suffix=".log")
        self.cmd = [str(binary), *model_args, "--host", "127.0.0.1",
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

    def sanitizer_reports(self):
        log = self.log()
        return [m for m in SANITIZER_MARKS if m in log]

    def stop(self):
        """SIGTERM, then wait; fails on a non-zero exit or a sanitizer report."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"dolphind did not exit within 90 s of SIGTERM:\n{self.log()[-4000:]}")
        bad = self.sanitizer_reports()
        assert not bad and rc == 0, f"dolphind exit {rc}, {bad}:\n{self.log()[-6000:]}"
        os.unlink(self.log_path)

    def rss_kib(self):
        """(VmRSS, RssAnon) in KiB: all resident memory, and the part that is
        not mapped files (heap, stacks: where a leak shows)."""
        fields = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                fields[key] = int(rest.split()[0])
        assert len(fields) == 2, "no VmRSS/RssAnon in /proc/PID/status"
        return fields["VmRSS"], fields["RssAnon"]

    # ---- HTTP --------------------------------------------------------------
    def headers(self, key=None):
        key = key or self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def post(self, path, body, key=None, timeout=HTTP_TIMEOUT_S, **kw):
        """POST `body` as JSON; headers= in kw add to the API key's."""
        headers = {**self.headers(key), **kw.pop("headers", {})}
        return requests.post(self.url + path, json=body, headers=headers, timeout=timeout,
                             **kw)

    def complete(self, body, **kw):
        return self.post("/v1/completions", body, **kw)

    def health(self):
        return requests.get(self.url + "/healthz", timeout=30).json()

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

    def open_raw(self, body, key=None, path="/v1/completions", ctype="application/json"):
        """Send a POST on a plain connection and return it without reading the
        answer (the caller reads it with getresponse() or hangs up). `body`
        is JSON-encoded unless it is bytes already."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=HTTP_TIMEOUT_S)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": ctype,
                                                        **self.headers(key)})
        return conn


def raw_exchange(port, data, head_only=False, timeout=10):
    """Send raw bytes on a fresh connection to 127.0.0.1:port; return what
    comes back until the end of the response head (head_only), or until the
    server closes the connection or `timeout` seconds of silence pass."""
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        try:
            while not (head_only and b"\r\n\r\n" in out):
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    return out


def hang_up(conn):
    """Close a client connection at once (FIN; the server must notice)."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    conn.close()


def parse_sse(data):
    """(events as parsed JSON, saw [DONE]) from a whole SSE body: a str,
    bytes, or a requests response (read to its end). Every event must be a
    `data: ...` line followed by a blank line, and nothing may follow [DONE]."""
    if hasattr(data, "iter_content"):
        data = b"".join(data.iter_content(chunk_size=None))
    if isinstance(data, bytes):
        data = data.decode("utf-8")
    assert data.endswith("\n\n"), f"stream does not end with a blank line: {data[-200:]!r}"
    events, done = [], False
    for block in data.split("\n\n")[:-1]:
        assert block.startswith("data: "), f"bad SSE block {block!r}"
        payload = block[len("data: "):]
        assert not done, "event after [DONE]"
        if payload == "[DONE]":
            done = True
            continue
        events.append(json.loads(payload))
    return events, done


def stream_texts(events, n_choices=1):
    """The streamed text per choice index (completions chunks)."""
    out = [""] * n_choices
    for ev in events:
        for ch in ev.get("choices", []):
            out[ch["index"]] += ch["text"]
    return out


def check_error_parts(status, headers, body, want, param=None, code=None, type_=None):
    """OpenAI's error shape ({"error": {message, type, param, code}}) with the
    status `want`, JSON, and X-Request-Id; returns error{}. `headers` is any
    case-insensitive mapping, `body` text or bytes."""
    assert status == want, f"want {want}, got {status}: {body[:300]!r}"
    assert headers.get("Content-Type", "").startswith("application/json"), dict(headers)
    assert headers.get("X-Request-Id"), dict(headers)
    doc = json.loads(body)
    assert set(doc) == {"error"}, doc
    err = doc["error"]
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err
    if param is not None:
        assert err["param"] == param, err
        assert param.split(".")[-1] in err["message"], err
    if code is not None:
        assert err["code"] == code, err
    if type_ is not None:
        assert err["type"] == type_, err
    return err


def check_error(resp, status, param=None, code=None, type_=None):
    """check_error_parts for a requests response."""
    return check_error_parts(resp.status_code, resp.headers, resp.text, status, param, code,
                             type_)
