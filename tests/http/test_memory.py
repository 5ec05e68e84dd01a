"""Memory of the CPU backend after start-up: the weights held once (the
checkpoint's pages released once converted) and the KV pool reported in
tokens and full contexts (docs/configuration.md, kv_cache_dtype and
kv_cache_memory_fraction).

Runs the Release dolphind (DOLPHIN_RELEASE_BIN, default build/dolphind: an
ASan build's shadow memory would swamp the figures) on a random checkpoint
of the 110m shape (256 MB of F16) made by build/dol-make-random-model.
"""
import os
import re
import subprocess
from pathlib import Path

import pytest

from dolphin_server import REPO, SHARED, Dolphind

RELEASE_BIN = Path(os.environ.get("DOLPHIN_RELEASE_BIN", REPO / "build" / "dolphind"))
MAKER = RELEASE_BIN.parent / "dol-make-random-model"
RSS_RATIO = 1.15   # RSS after ready / (weight bytes + KV pool bytes)


@pytest.fixture(scope="module")
def model_110m(tmp_path_factory):
    tok = SHARED / "models" / "tiny-llama2" / "tokenizer.model"
    if not MAKER.is_file() or not RELEASE_BIN.is_file() or not tok.is_file():
        pytest.skip("needs build/dolphind, build/dol-make-random-model and the shared tokenizer")
    out = tmp_path_factory.mktemp("m110") / "random-110m"
    subprocess.run([str(MAKER), "110m", str(out), "--tokenizer", str(tok)], check=True,
                   stdout=subprocess.DEVNULL)
    return out


def _ready_figures(d):
    """/healthz, and the resident bytes that hold the model: the anonymous
    memory (converted weights, KV pool, heap) plus the checkpoint's pages
    still resident. The shared libraries' pages are left out: a build with
    the CUDA backend maps cuBLAS, hundreds of MB that say nothing about how
    the weights are held."""
    h = d.health()
    _, anon_kib = d.rss_kib()
    ckpt_kib, path = 0, ""
    for line in Path(f"/proc/{d.proc.pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:   # a mapping's header line
            path = head[5] if len(head) >= 6 else ""
        elif head and head[0] == "Rss:" and path.endswith(".safetensors"):
            ckpt_kib += int(head[1])
    return h, (anon_kib + ckpt_kib) * 1024


@pytest.fixture(scope="module")
def base_bytes():
    """What the same binary holds with a model of ~1 MB: the process's own
    memory (the CUDA runtime and cuBLAS, when built in, hold ~90 MB of
    anonymous memory even without a GPU), left out of the ratio."""
    d = Dolphind(SHARED / "models" / "stories260K", ["--kv-cache-tokens", "256"],
                 binary=RELEASE_BIN)
    try:
        h, mem = _ready_figures(d)
        return mem - h["memory"]["weight_bytes"] - h["memory"]["total_bytes"]
    finally:
        d.stop()


@pytest.mark.parametrize("weights", ["f16", "nf4"])
def test_rss_after_ready_is_weights_plus_kv(model_110m, base_bytes, weights):
    """Resident memory after ready (anonymous + checkpoint pages, less what
    the process holds with a ~1 MB model) within 1.15 x (weights + KV pool):
    before the pages of the checkpoint were released it was about 2 x with
    F16 weights."""
    d = Dolphind(model_110m, ["--weights", weights, "--kv-cache-tokens", "256"],
                 binary=RELEASE_BIN)
    try:
        h, rss = _ready_figures(d)
        weights_b = h["memory"]["weight_bytes"]
        kv_b = h["memory"]["total_bytes"]   # the CPU backend reports its KV pool here
        assert h["kv_cache"]["tokens_total"] == 256
        rss -= base_bytes
        ratio = rss / (weights_b + kv_b)
        print(f"{weights}: rss={rss} weight_bytes={weights_b} kv_bytes={kv_b} ratio={ratio:.3f}")
        assert ratio <= RSS_RATIO, (f"RSS {rss} is {ratio:.2f} x weights {weights_b} + KV {kv_b}")
        m = re.search(r"event=weights_prepared .*released_bytes=(\d+)", d.log())
        assert m and int(m.group(1)) > 0.9 * 219_000_000, "no weights_prepared line with the release"
    finally:
        d.stop()


def test_checkpoint_pages_released(model_110m):
    """Either backend drops the checkpoint's pages once a tensor is converted
    (CPU) or on its way to the device (CUDA; DOLPHIN_BIN runs it under the
    emulation in scripts/ci-cuda-emu.sh): after ready, at most the embedding
    rows the CPU backend reads in place stay resident, not the checkpoint."""
    d = Dolphind(model_110m, ["--kv-cache-tokens", "256"])
    try:
        d.health()
        size = (model_110m / "model.safetensors").stat().st_size
        ckpt_kib, path = 0, ""
        for line in Path(f"/proc/{d.proc.pid}/smaps").read_text().splitlines():
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:
                path = head[5] if len(head) >= 6 else ""
            elif head and head[0] == "Rss:" and path.endswith("model.safetensors"):
                ckpt_kib += int(head[1])
        print(f"checkpoint pages resident after ready: {ckpt_kib} KiB of {size // 1024} KiB")
        assert ckpt_kib * 1024 < 0.05 * size, (ckpt_kib, size)
        released = [int(x) for x in re.findall(r"event=weights_prepared .*?released_bytes=(\d+)",
                                                d.log())]
        # the CPU backend keeps the embedding (a fifth of this checkpoint) mapped
        assert released and sum(released) > 0.7 * size, (released, size)
    finally:
        d.stop()


def test_kv_pool_default_and_dtype(model_110m):
    """The default pool: f16 with F16 weights, sized from the memory left
    (at least one full context, at most max_batch_size + 1), reported in
    tokens and full contexts; kv_cache_dtype f32 doubles the bytes per
    token."""
    d = Dolphind(model_110m, ["--max-batch-size", "2"], binary=RELEASE_BIN)
    try:
        kv = d.health()["kv_cache"]
        assert kv["dtype"] == "f16"
        assert 1.0 <= kv["full_contexts"] <= 3.0
        assert kv["tokens_total"] == kv["blocks_total"] * kv["block_size"]
        assert re.search(r"event=model_loaded .*kv_cache_dtype=f16 kv_cache_dtype_k=f16 kv_cache_dtype_v=f16 kv_tokens=\d+ kv_contexts=",
                         d.log())
        f16_bytes = d.health()["memory"]["total_bytes"] / kv["tokens_total"]
    finally:
        d.stop()
    d = Dolphind(model_110m, ["--kv-cache-dtype", "f32", "--kv-cache-tokens", "512"],
                 binary=RELEASE_BIN)
    try:
        h = d.health()
        assert h["kv_cache"]["dtype"] == "f32"
        assert h["memory"]["total_bytes"] / h["kv_cache"]["tokens_total"] == 2 * f16_bytes
        r = d.complete({"model": d.model, "prompt": "Once upon a time", "max_tokens": 4,
                        "temperature": 0})
        assert r.status_code == 200, r.text
    finally:
        d.stop()
