"""SIGTERM with requests in flight: /healthz turns 503 "draining" and new
work gets 503 on connections open from before (new ones are refused), the in-flight requests are answered (or end with an error event
when the drain timeout cuts them off), and the process exits 0 without a
sanitizer report. Uses its own server, stopped by the test itself.

/healthz while loading (503 "loading") is not tested: the test models load
in milliseconds, too fast to catch reliably."""
import signal
import socket
import subprocess
import threading
import time

import requests

from dolphin_server import BIN, check_error, model_dir, Dolphind

LONG = {"prompt": ["", "The cat", "Once", "Tom"], "n": 8, "max_tokens": 500,
        "ignore_eos": True, "temperature": 0.5}


def test_sigterm_drains_and_exits():
    srv = Dolphind("stories260K", ["--drain-timeout-s", "1"])
    outcomes = {}

    def non_stream():
        try:
            r = requests.post(srv.url + "/v1/completions", json=LONG, timeout=60)
            outcomes["plain"] = r.status_code
        except requests.RequestException as e:
            outcomes["plain"] = repr(e)

    def stream():
        try:
            with requests.post(srv.url + "/v1/completions", json=dict(LONG, stream=True),
                               stream=True, timeout=60) as r:
                data = b""
                for chunk in r.iter_content(chunk_size=None):
                    data += chunk
                    time.sleep(0.01)   # a slow reader
                outcomes["stream"] = data[-200:]
        except requests.RequestException as e:
            outcomes["stream"] = repr(e)

    threads = [threading.Thread(target=non_stream), threading.Thread(target=stream)]
    # kept-alive connections from before the signal (new ones are refused after it)
    probe, work = requests.Session(), requests.Session()
    try:
        for t in threads:
            t.start()
        deadline = time.time() + 20
        while time.time() < deadline:
            h = requests.get(srv.url + "/healthz", timeout=10).json()
            if h["scheduler"]["running_requests"] > 0:
                break
            time.sleep(0.02)
        assert probe.get(srv.url + "/livez", timeout=10).status_code == 200
        assert work.get(srv.url + "/livez", timeout=10).status_code == 200
        srv.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 5
        while time.time() < deadline:
            r = probe.get(srv.url + "/healthz", timeout=10)
            if r.status_code == 503:
                break
            time.sleep(0.01)
        assert r.status_code == 503
        assert r.json()["status"] == "draining"
        assert r.json()["reasons"]
        r = work.post(srv.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1},
                      timeout=10)
        err = check_error(r, 503)
        assert r.headers["Connection"] == "close"
        assert err["type"] == "service_unavailable"
    finally:
        for t in threads:
            t.join(timeout=60)
        srv.stop()   # asserts exit 0 and a clean sanitizer log
    assert not any(t.is_alive() for t in threads)
    assert set(outcomes) == {"plain", "stream"}, outcomes


def test_port_in_use_is_one_clear_line():
    if not BIN.is_file():
        import pytest
        pytest.skip(f"{BIN} not built")
    d = model_dir("stories260K")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = subprocess.run([str(BIN), "--model", str(d), "--host", "127.0.0.1",
                            "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert f"cannot bind 127.0.0.1:{port}: Address already in use" in p.stderr, p.stderr
