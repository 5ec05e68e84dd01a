"""Idle and slow clients (docs/robustness.md), on servers of their own with a short
connection_timeout_s: connections that send nothing, stop in the middle of
their headers or of their body neither delay other clients nor stay open
past the timeout; a client that trickles its request with pauses shorter
than the timeout is still served; at max_connections, a new connection waits
until an idle one is dropped instead of being refused for good; beyond
max_connections_per_ip, new connections from that address are closed at
once."""
import socket
import time

import pytest
import requests

from dolphin_server import Dolphind

TIMEOUT_S = 3          # --connection-timeout-s of these servers
SLACK_S = 6            # how late a drop may come on a loaded machine
BODY = b'{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}'


@pytest.fixture(scope="module")
def srv():
    d = Dolphind("stories260K", ["--connection-timeout-s", TIMEOUT_S, "--max-connections", 12])
    yield d
    d.stop()


def connect(srv, first=b""):
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=TIMEOUT_S + SLACK_S + 5)
    if first:
        s.sendall(first)
    return s


def request_bytes(srv, body=BODY, length=None):
    n = len(body) if length is None else length
    return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {n}\r\n\r\n").encode() + body


def wait_closed(s):
    """Read until the server closes the connection; (seconds waited, bytes)."""
    t0, got = time.monotonic(), b""
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    except ConnectionResetError:
        pass
    finally:
        s.close()
    return time.monotonic() - t0, got


def quick_completion(srv):
    t0 = time.monotonic()
    r = requests.post(srv.url + "/v1/completions", json={"prompt": "Once", "max_tokens": 4},
                      timeout=60)
    assert r.status_code == 200, r.text
    return time.monotonic() - t0


def test_idle_and_stalled_clients_neither_block_nor_stay(srv):
    head = request_bytes(srv)
    slow = [connect(srv) for _ in range(3)]                              # nothing at all
    slow += [connect(srv, head[:20]) for _ in range(2)]                  # half a header
    slow += [connect(srv, request_bytes(srv, BODY[:10], len(BODY)))      # part of the body
             for _ in range(2)]
    t_open = time.monotonic()
    # Others are served at once, while every slow connection is still open.
    for _ in range(3):
        assert quick_completion(srv) < TIMEOUT_S - 0.5
    assert time.monotonic() - t_open < TIMEOUT_S - 0.5
    # Then each slow connection is closed by the server, unanswered, about
    # connection_timeout_s after its last byte.
    for s in slow:
        _, got = wait_closed(s)
        waited = time.monotonic() - t_open
        assert TIMEOUT_S - 1 <= waited <= TIMEOUT_S + SLACK_S, waited
        assert b" 200 " not in got, got[:200]
    assert quick_completion(srv) < 30


def test_trickled_request_is_served(srv):
    """The timeout is about silence, not speed: pauses shorter than it are fine."""
    data = request_bytes(srv)
    s = connect(srv)
    step = len(data) // 4 + 1
    for i in range(0, len(data), step):
        s.sendall(data[i:i + step])
        time.sleep(TIMEOUT_S / 3)
    s.settimeout(60)
    got = b""
    while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    s.close()
    assert got.startswith(b"HTTP/1.1 200"), got[:200]


def test_connection_limit_waits_for_idle_ones_to_go(srv):
    idle = [connect(srv) for _ in range(12)]   # every slot of --max-connections 12
    time.sleep(0.3)
    t0 = time.monotonic()
    took = quick_completion(srv)               # queued until the idle ones time out
    assert took >= 1.0, took
    assert time.monotonic() - t0 <= TIMEOUT_S + SLACK_S + 5
    for s in idle:
        wait_closed(s)


def test_per_ip_limit_closes_extra_connections():
    d = Dolphind("stories260K", ["--max-connections-per-ip", 2, "--connection-timeout-s", 30])
    try:
        time.sleep(0.5)   # let the server see the start-up probe's connection close
        held = [connect(d), connect(d)]
        time.sleep(0.3)
        extra = connect(d)
        try:
            extra.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        except OSError:
            pass  # already closed
        waited, got = wait_closed(extra)
        assert waited < 5 and got == b"", (waited, got[:100])
        for s in held:
            s.close()
        time.sleep(0.3)
        assert requests.get(d.url + "/livez", timeout=30).status_code == 200
    finally:
        d.stop()
