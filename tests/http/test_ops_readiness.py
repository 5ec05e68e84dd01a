"""Readiness (GET /healthz, docs/deployment.md) and liveness (GET /livez): the body's
shape and figures, and the memory hysteresis — on the CPU backend the
KV-cache pool stands in for device memory, so a tiny pool kept full by a
stream of long requests must turn /healthz 503 only after use has stayed
above vram_unready_ratio for vram_unready_after_s, stay 503 while it does,
and return to 200 once the requests end."""
import threading
import time

import pytest
import requests

from dolphin_server import Dolphind
from ops_util import log_records, parse_exposition, value


@pytest.fixture(scope="module")
def dolphin():
    srv = Dolphind("stories260K")
    yield srv
    srv.stop()


def test_healthz_body(dolphin):
    r = requests.get(dolphin.url + "/healthz", timeout=30)
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/json" and r.headers["X-Request-Id"]
    h = r.json()
    assert h["status"] == "ready" and h["state"] == "ready" and h["ready"] is True
    assert h["reasons"] == [] and h["model"] == "stories260K" and h["backend"] == "cpu"
    m = h["memory"]
    assert m["source"] == "kv_cache"          # the CPU backend's stand-in for VRAM
    assert m["total_bytes"] > 0 and 0 <= m["used_bytes"] <= m["total_bytes"]
    assert m["ratio"] == pytest.approx(m["used_bytes"] / m["total_bytes"])
    assert m["unready_ratio"] == 0.9 and m["unready_after_s"] == 15    # the defaults
    assert m["above_for_s"] == 0 and m["unready"] is False
    assert m["weight_bytes"] > 0
    assert "gpu_utilization_ratio" in m        # null without NVML
    # the pool's bytes are whole blocks
    kv = h["kv_cache"]
    assert m["total_bytes"] % kv["blocks_total"] == 0
    sc = h["scheduler"]
    assert sc["idle"] in (True, False) and sc["progress_age_ms"] >= 0 and sc["stall_ms"] >= 0


def test_livez(dolphin):
    r = requests.get(dolphin.url + "/livez", timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "alive"
    assert r.headers["X-Request-Id"]


def test_memory_figures_follow_a_running_request(dolphin):
    body = {"prompt": "Once", "max_tokens": 400, "ignore_eos": True}
    t = threading.Thread(target=requests.post, args=(dolphin.url + "/v1/completions",),
                         kwargs={"json": body, "timeout": 120})
    t.start()
    try:
        seen = None
        for _ in range(500):
            h = requests.get(dolphin.url + "/healthz", timeout=30).json()
            if h["memory"]["used_bytes"] > 0:
                seen = h
                break
            time.sleep(0.005)
        assert seen, "memory use never rose"
        per_block = seen["memory"]["total_bytes"] // seen["kv_cache"]["blocks_total"]
        # BOS + "Once" + 400 tokens reserved up front: 26 blocks of 16
        assert seen["memory"]["used_bytes"] == 26 * per_block
        assert seen["status"] == "ready"
    finally:
        t.join(120)
    h = None
    for _ in range(300):
        h = requests.get(dolphin.url + "/healthz", timeout=30).json()
        if h["memory"]["used_bytes"] == 0:
            break
        time.sleep(0.01)
    assert h["memory"]["used_bytes"] == 0, h


# ---- hysteresis ----------------------------------------------------------------

# 64 tokens = 4 blocks of 16. Each request reserves 2 + 60 tokens = 4 blocks
# (the whole pool: use 1.0 > 0.5) for the 60 steps it runs, so one runs at a
# time; six clients keep the queue non-empty, so the pool never drains
# between two requests (the next one is admitted in the same scheduler
# iteration that retires the last).
HYST_FLAGS = ["--kv-cache-tokens", "64", "--vram-unready-ratio", "0.5",
              "--vram-unready-after-s", "0.5", "--batch-window-ms", "0"]
HYST_BODY = {"prompt": "Once", "max_tokens": 60, "ignore_eos": True, "temperature": 0}
N_CLIENTS = 6


def test_readiness_hysteresis_with_a_small_kv_pool():
    srv = Dolphind("stories260K", HYST_FLAGS)
    stop = threading.Event()
    statuses = []

    def client():
        while not stop.is_set():
            r = requests.post(srv.url + "/v1/completions", json=HYST_BODY, timeout=120)
            statuses.append(r.status_code)

    clients = [threading.Thread(target=client, daemon=True) for _ in range(N_CLIENTS)]
    try:
        h0 = requests.get(srv.url + "/healthz", timeout=30)
        assert h0.status_code == 200 and h0.json()["memory"]["ratio"] == 0
        assert h0.json()["memory"]["unready_after_s"] == 0.5
        for t in clients:
            t.start()

        # 1. above the ratio but not yet for 0.5 s: still 200
        # 2. then 503, with the reason and the figures
        samples, t0 = [], time.monotonic()
        while time.monotonic() - t0 < 60:
            r = requests.get(srv.url + "/healthz", timeout=30)
            samples.append((time.monotonic(), r.status_code, r.json()))
            if r.status_code == 503:
                break
            time.sleep(0.02)
        t_unready, code, h = samples[-1]
        assert code == 503, f"never unready; last /healthz: {h}"
        assert h["status"] == "memory_pressure" and h["state"] == "ready" and not h["ready"]
        m = h["memory"]
        assert m["unready"] is True and m["ratio"] > 0.5 and m["above_for_s"] >= 0.5
        assert len(h["reasons"]) == 1 and "vram_unready_ratio" in h["reasons"][0]
        assert any(c == 200 and s["memory"]["ratio"] > 0.5 and s["memory"]["above_for_s"] < 0.5
                   for _, c, s in samples), "no grace period before 503"
        _, ms = parse_exposition(requests.get(srv.url + "/metrics", timeout=30).text)
        assert value(ms, "dolphin_ready") == 0

        # 3. it stays 503 while the pool stays full (no flapping between requests)
        held_until = time.monotonic() + 1.5
        while time.monotonic() < held_until:
            r = requests.get(srv.url + "/healthz", timeout=30)
            assert r.status_code == 503, r.json()
            time.sleep(0.02)
        # readiness never refuses work on its own: the requests still succeed
        assert statuses and set(statuses) == {200}, statuses

        # 4. the load goes away: 200 again, promptly
        stop.set()
        for t in clients:
            t.join(120)
        t_stop = time.monotonic()
        while time.monotonic() - t_stop < 10:
            r = requests.get(srv.url + "/healthz", timeout=30)
            if r.status_code == 200:
                break
            time.sleep(0.02)
        assert r.status_code == 200, r.json()
        h = r.json()
        assert h["ready"] and h["memory"]["unready"] is False and h["memory"]["ratio"] <= 0.5
        assert h["memory"]["above_for_s"] == 0 and h["reasons"] == []

        recs = log_records(srv.log())
        assert any(x.get("event") == "memory_unready" and x.get("level") == "warn" for x in recs)
        assert any(x.get("event") == "memory_ready" for x in recs)
    finally:
        stop.set()
        for t in clients:
            if t.is_alive():
                t.join(120)
        srv.stop()


def test_zero_delay_means_immediately():
    """vram_unready_after_s 0: unready as soon as use is above the ratio."""
    srv = Dolphind("tiny-llama2", ["--kv-cache-tokens", "64", "--vram-unready-ratio", "0.5",
                                       "--vram-unready-after-s", "0"])
    try:
        # tens of ms of decoding (tiny-llama2, 5 logprobs a token)
        body = {"prompt": "Once", "max_tokens": 60, "ignore_eos": True, "logprobs": 5}
        t = threading.Thread(target=requests.post, args=(srv.url + "/v1/completions",),
                             kwargs={"json": body, "timeout": 120})
        t.start()
        got = None
        for _ in range(1000):
            r = requests.get(srv.url + "/healthz", timeout=30)
            h = r.json()
            if h["memory"]["ratio"] > 0.5:
                got = (r.status_code, h)
                break
            time.sleep(0.002)
        t.join(120)
        assert got and got[0] == 503 and got[1]["memory"]["unready"], got
    finally:
        srv.stop()
