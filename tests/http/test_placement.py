"""Layer placement over HTTP: dolphind with the model's blocks split over two
CUDA devices, over two devices and the CPU, and with gpu_layers 1. Each
placement: the start-up log names every device's blocks and bytes; 8
greedy requests sent at once return what each returns alone (the golden text
where the margins allow); /metrics lists the memory of every device; after
clients hang up mid-generation every KV block is free again, on every
device. Settings that cannot work exit 2 with one line naming the device.

Needs a dolphind that sees two CUDA devices: the CUDA emulation build with
DOLPHIN_CUDA_EMU_DEVICES=2 (scripts/ci-cuda-emu.sh sets
DOLPHIN_TEST_PLACEMENT=1 and runs it), or a machine with two GPUs."""
import os
import re
import socket
import json
import subprocess
import time

import pytest
import requests

from dolphin_server import BIN, Dolphind, golden, gguf_file, model_dir
from test_scheduler import all_at_once, invariance_cases, text_of

pytestmark = pytest.mark.skipif(os.environ.get("DOLPHIN_TEST_PLACEMENT") != "1",
                                reason="needs two CUDA devices (DOLPHIN_TEST_PLACEMENT=1)")

MODEL = "stories260K"
MAX_TOKENS = 12
PLACEMENTS = {
    "split-2": (["--devices", "0,1", "--layer-split", "2,3"], {"cuda:0": 2, "cuda:1": 3}),
    "split-3-cpu": (["--devices", "0,1", "--layer-split", "1,2", "--gpu-layers", "3"],
                    {"cuda:0": 1, "cuda:1": 2, "cpu": 2}),
    "gpu-layers-1": (["--gpu-layers", "1"], {"cuda:0": 1, "cpu": 4}),
}


@pytest.fixture(autouse=True)
def two_devices(monkeypatch):
    monkeypatch.setenv("DOLPHIN_CUDA_EMU_DEVICES", "2")


def metric_lines(srv, name):
    text = requests.get(srv.url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^%s\{(?:model="[^"]*",)?device="([^"]+)"\} (\S+)$' % name,
                                 text, re.M)}


def hang_up_after(srv, body, after_s):
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    time.sleep(after_s)
    s.close()


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_placement(name):
    args, blocks = PLACEMENTS[name]
    t0 = time.monotonic()
    srv = Dolphind(MODEL, ["--max-batch-size", "8", "--batch-window-ms", "250", *args])
    print(f"{name}: started in {time.monotonic() - t0:.1f} s")
    try:
        # the start-up log: one line per device, with its blocks and bytes
        logged = {m.group(1): m.group(0) for m in
                  re.finditer(r"event=placement device=(\S+) .*", srv.log())}
        assert set(logged) == set(blocks), srv.log()
        for dev, n in blocks.items():
            assert f"n_blocks={n} " in logged[dev], logged[dev]
            assert re.search(r"weight_bytes=[1-9]\d* kv_bytes=[1-9]\d*", logged[dev]), logged[dev]
            assert re.search(r"step_read_bytes=[1-9]", logged[dev]), logged[dev]

        # batch invariance: 8 at once give what each gives alone (golden where safe)
        # (at most MAX_TOKENS each: the emulation is slow; the C test checks the full goldens)
        bodies, expected = invariance_cases(srv, MODEL)
        for b in bodies:
            b["max_tokens"] = min(b["max_tokens"], MAX_TOKENS)
        alone = [text_of(srv.complete(b)) for b in bodies]
        for b, t, e in zip(bodies, alone, expected):
            if e is not None:
                assert e.startswith(t), f"{name}, alone, {b}: {t!r} does not begin golden {e!r}"
        together = [text_of(r) for r in all_at_once(srv, bodies)]
        assert together == alone, name
        print(f"{name}: invariance done at {time.monotonic() - t0:.1f} s")

        # memory per device in /metrics
        assert set(metric_lines(srv, "dolphin_device_memory_per_device_total_bytes")) == set(blocks)
        assert metric_lines(srv, "dolphin_device_blocks") == {d: float(n) for d, n in blocks.items()}

        # clients that hang up mid-generation: every block comes back
        for i in range(8):
            hang_up_after(srv, {"prompt": "Once upon a time", "max_tokens": 400, "n": 1 + i % 2,
                                "temperature": 0.8}, 0.05 * (i % 4))
        srv.wait_idle(timeout=120)
        print(f"{name}: cancellations done at {time.monotonic() - t0:.1f} s")
        kv = srv.sched()[1]
        srv.wait_for(lambda h: h["kv_cache"]["blocks_used"] == 0, 60, "every KV block free")
        h = srv.health()
        assert {d["device"]: d["blocks"] for d in h["memory"]["devices"]} == blocks, h
        if "cpu" in blocks:  # the CPU range's memory figure is its KV pool in use
            cpu = [d for d in h["memory"]["devices"] if d["device"] == "cpu"][0]
            assert cpu["used_bytes"] == 0 and cpu["total_bytes"] > 0, h
            assert metric_lines(srv, "dolphin_device_memory_per_device_used_bytes")["cpu"] == 0
        assert requests.get(srv.url + "/healthz", timeout=30).status_code == 200, kv
    finally:
        srv.stop()


def test_placement_gguf_block_types():
    """A GGUF file in block types (k256 Q4_K_M: Q4_K layers with Q6_K parts)
    over two devices and the CPU: every range holds its blocks as stored (the
    bytes logged are about the file's), and the greedy ids equal the float64
    reference's up to the first step whose margin is below 5e-2."""
    path = gguf_file("k256-Q4_K_M.gguf")
    entry = golden("gguf-k256")["files"]["Q4_K_M"]
    srv = Dolphind(str(path), ["--devices", "0,1", "--layer-split", "1,2", "--gpu-layers", "3"],
                   threads=1)
    try:
        logged = {m.group(1): m.group(0) for m in
                  re.finditer(r"event=placement device=(\S+) .*", srv.log())}
        assert {d: int(re.search(r"n_blocks=(\d+)", l).group(1)) for d, l in logged.items()} == \
            {"cuda:0": 1, "cuda:1": 2, "cpu": 1}, srv.log()
        held = sum(int(re.search(r"weight_bytes=(\d+)", l).group(1)) for l in logged.values())
        assert held < 1.1 * path.stat().st_size, srv.log()
        for ref in entry["reference"]["cases"][:2]:
            k = next((i for i, m in enumerate(ref["greedy_margins"]) if m < 5e-2),
                     len(ref["greedy_ids"]))
            n = min(ref["max_tokens"], MAX_TOKENS)
            r = srv.complete({"model": srv.model, "prompt": ref["prompt"], "max_tokens": n,
                              "temperature": 0, "return_token_ids": True})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["token_ids"][:min(k, n)] == ref["greedy_ids"][:min(k, n)]
    finally:
        srv.stop()


def run_to_exit(*args, env=None):
    cmd = [str(BIN), "--model", str(model_dir(MODEL)), "--port", "0", "--threads", "2", *args]
    e = dict(os.environ, **(env or {}))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=e)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize("args,env,want", [
    (["--devices", "0,5"], {}, "cuda:5 does not exist"),
    (["--devices", "0,1", "--layer-split", "2,2"], {}, "layer_split: the counts add up to 4 blocks"),
    (["--devices", "0,1", "--layer-split", "1,4"], {"DOLPHIN_CUDA_EMU_MEM_MIB": "780"},
     "layer_split: cuda:0 cannot hold blocks 0..0"),
    (["--gpu-layers", "9"], {}, "gpu_layers: 9 is not between 0"),
])
def test_impossible_settings_exit_2(args, env, want):
    rc, out = run_to_exit(*args, env=env)
    assert rc == 2, out
    errors = [ln for ln in out.splitlines() if "level=error" in ln or want in ln]
    assert any(want in ln for ln in errors), out
    if "cannot hold" in want:
        assert re.search(r"short by \d+ bytes", out), out
