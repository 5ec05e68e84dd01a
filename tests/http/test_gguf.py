"""GGUF files served end to end (dolphind --model FILE.gguf, and a models:
entry whose path is a .gguf file): for the F32/F16 files of the shared
fixtures and every block-quantized one, the prompt ids equal llama.cpp's, the greedy ids equal the float64
reference's up to the first step whose margin is below 1e-3, and every
answer of the F32/F16 files (text, ids, logprobs) is the one the
safetensors checkpoint the file was made from gives, bit for bit (the unit test test_gguf holds the top-8
logits to the reference within 1e-3; equal logprobs carry that here).
/v1/models, /healthz and the model_loaded line name the format and the
type mix; a file this build cannot serve ends the start with exit 2 and one
line naming the file and the tensor or key."""
import json
import os
import re
import subprocess

import pytest
import requests

from dolphin_server import BIN, SHARED, Dolphind, golden, gguf_file, model_dir

# the reference's ids are held up to the first step whose margin is below
# this (scripts/ci-cuda-emu.sh sets 5e-2 for the FP16 CUDA backend)
SMALL_MARGIN = float(os.environ.get("DOLPHIN_GGUF_MARGIN", "1e-3"))
EXACT = SMALL_MARGIN <= 1e-3

# (gguf file, the checkpoint it was made from, golden name, golden entry, type mix)
FILES = [
    ("stories260K-F32.gguf", "stories260K", "gguf-stories260K", "F32", "F32 47"),
    ("k256-F16.gguf", "k256", "gguf-k256", "F16", "F16 30, F32 9"),
    ("tiny-llama2-F16.gguf", "tiny-llama2", "gguf-tiny-llama2", "F16", "F16 23, F32 7"),
]


@pytest.fixture(scope="module", params=FILES, ids=[f[0] for f in FILES])
def pair(request):
    """A server on the GGUF file and one on its safetensors checkpoint (F32
    KV cache both, so that the comparison with the reference is fair)."""
    file, ckpt, gold, key, mix = request.param
    path = gguf_file(file)
    g = Dolphind(str(path), ["--kv-cache-dtype", "f32"], threads=1)
    h = Dolphind(str(model_dir(ckpt)), ["--kv-cache-dtype", "f32"], threads=1)
    yield g, h, golden(gold)["files"][key], mix
    g.stop()
    h.stop()


def _decided(case):
    for k, m in enumerate(case["greedy_margins"]):
        if m < SMALL_MARGIN:
            return k
    return len(case["greedy_ids"])


def _body(model, prompt, n):
    return {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
            "logprobs": 5, "return_token_ids": True}


def test_greedy_against_reference_and_checkpoint(pair):
    g, h, entry, _ = pair
    for ref, lcpp in zip(entry["reference"]["cases"], entry["llama_cpp"]["cases"]):
        n = ref["max_tokens"]
        rg = g.complete(_body(g.model, ref["prompt"], n))
        rh = h.complete(_body(h.model, ref["prompt"], n))
        assert rg.status_code == 200, rg.text
        assert rh.status_code == 200, rh.text
        cg, ch = rg.json()["choices"][0], rh.json()["choices"][0]
        # the tokenizer from the file: llama.cpp's prompt ids
        assert cg["prompt_token_ids"] == lcpp["prompt_ids"]
        # the reference, up to the first undecided step
        k = _decided(ref)
        assert cg["token_ids"][:k] == ref["greedy_ids"][:k]
        # the checkpoint it was made from: the same answer, bit for bit
        assert cg["token_ids"] == ch["token_ids"]
        assert cg["text"] == ch["text"]
        assert cg["logprobs"] == ch["logprobs"]
        assert rg.json()["usage"] == rh.json()["usage"]
        # the first step's best two logits are the reference's (logprobs
        # differ from logits by one constant per step)
        top = ref["last_logits_top8"]
        first = cg["logprobs"]["top_logprobs"][0]
        vals = sorted(first.values(), reverse=True)
        if EXACT and len(vals) >= 2 and len(first) == 5:
            assert abs((vals[0] - vals[1]) - (top[0][1] - top[1][1])) < 2e-3


def test_token_id_prompt(pair):
    g, _, entry, _ = pair
    ref = entry["reference"]["cases"][0]
    k = _decided(ref)
    if k == 0:
        pytest.skip("first step is undecided")
    r = g.complete({"model": g.model, "prompt": ref["prompt_ids"], "max_tokens": k,
                    "temperature": 0, "return_token_ids": True})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"][:k] == ref["greedy_ids"][:k]


def test_format_and_types_shown(pair):
    g, h, _, mix = pair
    r = requests.get(g.url + "/v1/models", timeout=30)
    assert r.status_code == 200
    (m,) = r.json()["data"]
    assert m["id"] == g.model
    assert m["dolphin"]["file_format"] == "gguf"
    assert m["dolphin"]["file_types"] == mix
    (mh,) = requests.get(h.url + "/v1/models", timeout=30).json()["data"]
    assert mh["dolphin"]["file_format"] == "safetensors"
    hz = g.health()
    (entry,) = hz["models"]
    assert entry["file_format"] == "gguf" and entry["file_types"] == mix
    line = [ln for ln in g.log().splitlines() if "event=model_loaded" in ln]
    assert line and "file_format=gguf" in line[0] and f'file_types="{mix}"' in line[0]
    # the un-permuted attn_q / attn_k copies are freed once the engine holds them
    assert "event=model_copies_freed" in g.log()
    assert "event=model_copies_freed" not in h.log()


def test_models_entry_with_a_gguf_path(tmp_path):
    path = gguf_file("stories260K-F32.gguf")
    cfg = tmp_path / "dolphin.yaml"
    cfg.write_text(f"models:\n  - name: story\n    path: {path}\n")
    srv = Dolphind(None, ["--config", str(cfg)], threads=1)
    try:
        r = srv.complete({"model": "story", "prompt": "Once upon a time", "max_tokens": 8,
                          "temperature": 0})
        assert r.status_code == 200, r.text
        want = golden("gguf-stories260K")["files"]["F32"]["reference"]["cases"][1]
        assert want["greedy_text"].startswith(r.json()["choices"][0]["text"])
        (m,) = requests.get(srv.url + "/v1/models", timeout=30).json()["data"]
        assert m["id"] == "story" and m["dolphin"]["file_format"] == "gguf"
    finally:
        srv.stop()


def _mix(counts):
    """The type mix as Dolphin writes it: most frequent first, then by name."""
    return ", ".join(f"{t} {n}" for t, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


# every block-quantized file of the goldens: (file, golden name, entry)
def _qfiles():
    out = []
    for g in ("gguf-k256", "gguf-tiny-llama2"):
        p = SHARED / "golden" / f"{g}.json"
        if p.is_file():
            out += [(e["file"], g, k) for k, e in json.loads(p.read_text())["files"].items()
                    if k not in ("F16", "F32")]
    return out


QFILES = _qfiles()


@pytest.fixture(scope="module", params=QFILES, ids=[f[0] for f in QFILES])
def quantized(request):
    file, gold, key = request.param
    srv = Dolphind(str(gguf_file(file)), ["--kv-cache-dtype", "f32"], threads=1)
    yield srv, golden(gold)["files"][key]
    srv.stop()


def test_quantized_against_reference(quantized):
    """A quantized file served as it is: llama.cpp's prompt ids, the
    reference's greedy ids up to the first undecided step, the first step's
    best two logits 2e-3 from the reference's, the type mix and the bytes
    held shown."""
    g, entry = quantized
    for ref, lcpp in zip(entry["reference"]["cases"], entry["llama_cpp"]["cases"]):
        # only the decided steps are compared: generate no further
        k = _decided(ref)
        r = g.complete(_body(g.model, ref["prompt"], max(1, min(k, ref["max_tokens"]))))
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        assert c["prompt_token_ids"] == lcpp["prompt_ids"]
        assert c["token_ids"][:k] == ref["greedy_ids"][:k]
        top = ref["last_logits_top8"]
        vals = sorted(c["logprobs"]["top_logprobs"][0].values(), reverse=True)
        if EXACT and len(vals) >= 2:
            assert abs((vals[0] - vals[1]) - (top[0][1] - top[1][1])) < 2e-3
    (m,) = requests.get(g.url + "/v1/models", timeout=30).json()["data"]
    mix = _mix(entry["tensor_type_counts"])
    assert m["dolphin"]["file_format"] == "gguf" and m["dolphin"]["file_types"] == mix
    # the layers are read in place: the bytes held are about the file's
    assert 0.9 * entry["bytes"] < m["dolphin"]["memory_bytes"] < 1.1 * entry["bytes"] + (64 << 20)
    (h,) = g.health()["models"]
    assert h["file_types"] == mix


def _retyped(src, tensor, type_id):
    """The bytes of GGUF file src with tensor's ggml type id replaced: its
    entry in the tensor table is the name, n_dims, the dims, then the type."""
    name = tensor.encode()
    i = src.index(len(name).to_bytes(8, "little") + name)
    j = i + 8 + len(name)
    n_dims = int.from_bytes(src[j:j + 4], "little")
    t = j + 4 + 8 * n_dims
    return src[:t] + type_id.to_bytes(4, "little") + src[t + 4:]


def test_unsupported_type_exit_2(tmp_path):
    """A type outside the served ones (IQ4_NL, id 20, which has Q4_0's block
    geometry so that only its type is wrong): exit 2 and one line naming the
    file, the tensor and the type."""
    if not BIN.is_file():
        pytest.skip(f"{BIN} not built")
    bad = tmp_path / "iq4.gguf"
    bad.write_bytes(_retyped(gguf_file("k256-Q4_0.gguf").read_bytes(), "blk.1.ffn_up.weight", 20))
    p = subprocess.run([str(BIN), "--model", str(bad), "--port", "0", "--threads", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert f"{bad}: tensor blk.1.ffn_up.weight: type IQ4_NL is not supported" in last, last


def test_broken_file_exit_2(tmp_path):
    """A truncated copy (of the header and tensor table only) and a file
    with another tokenizer: exit 2, one line naming the file and field."""
    if not BIN.is_file():
        pytest.skip(f"{BIN} not built")
    src = gguf_file("stories260K-F32.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(src[:20000])
    p = subprocess.run([str(BIN), "--model", str(cut), "--port", "0", "--threads", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert f"{cut}: tensor " in last and "runs past the end of the file" in last, last
    # the same header with the tokenizer model renamed (same length: "gpt2!")
    gpt = tmp_path / "gpt2.gguf"
    i = src.index(b"tokenizer.ggml.model")
    j = src.index(b"llama", i + 20)
    gpt.write_bytes(src[:j] + b"gpt2!" + src[j + 5:])
    p = subprocess.run([str(BIN), "--model", str(gpt), "--port", "0", "--threads", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert f'{gpt}: key tokenizer.ggml.model: tokenizer "gpt2!" is not supported' in last, last


def _two_starts(file, cache_dir, max_tokens):
    """Two starts on file with --weights-cache-dir cache_dir: the greedy ids
    of one prompt each time, the weights_cache results logged, and whether
    the backend was CUDA."""
    results, ids, cuda = [], [], False
    for _ in range(2):
        srv = Dolphind(str(gguf_file(file)), ["--weights-cache-dir", str(cache_dir)], threads=1)
        try:
            r = srv.complete({"model": srv.model, "prompt": "Once upon a time",
                              "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True})
            assert r.status_code == 200, r.text
            ids.append(r.json()["choices"][0]["token_ids"])
            results += re.findall(r"event=weights_cache result=(\w+)", srv.log())
            cuda = "event=model_loaded backend=cuda" in srv.log()
        finally:
            srv.stop()
    return ids, results, cuda


def test_weights_cache_miss_then_hit(tmp_path):
    """The prepared-weights cache keys a GGUF model by its file: a second
    start maps what the first one wrote and answers the same."""
    ids, results, cuda = _two_starts("k256-F16.gguf", tmp_path, 12)
    if cuda:
        pytest.skip("the CUDA backend does not use the prepared-weights cache")
    assert results == ["miss", "hit"], results
    assert ids[0] == ids[1]


def test_weights_cache_with_block_types(tmp_path):
    """A file whose linear layers are all block-quantized has nothing to
    prepare (result=not_needed, no file written); tiny-llama2's Q4_K_M mix,
    with F16 fallbacks, caches those and hits on the second start."""
    for file, want in (("k256-Q4_K_M.gguf", ["not_needed", "not_needed"]),
                       ("tiny-llama2-Q4_K_M.gguf", ["miss", "hit"])):
        d = tmp_path / file
        d.mkdir()
        ids, results, cuda = _two_starts(file, d, 8)
        if cuda:
            pytest.skip("the CUDA backend does not use the prepared-weights cache")
        assert results == want, (file, results)
        assert ids[0] == ids[1]
        if want[0] == "not_needed":
            assert list(d.iterdir()) == []


def test_two_gguf_models_and_metrics(tmp_path):
    """Two quantized files in one models: list: each answers as its own,
    /healthz and /metrics list both."""
    a, b = gguf_file("k256-Q4_0.gguf"), gguf_file("k256-Q6_K.gguf")
    cfg = tmp_path / "dolphin.yaml"
    cfg.write_text(f"models:\n  - name: q4\n    path: {a}\n  - name: q6\n    path: {b}\n")
    srv = Dolphind(None, ["--config", str(cfg)], threads=1)
    try:
        gold = golden("gguf-k256")["files"]
        for name, key in (("q4", "Q4_0"), ("q6", "Q6_K")):
            ref = gold[key]["reference"]["cases"][0]
            r = srv.complete({"model": name, "prompt": ref["prompt"], "max_tokens": 8,
                              "temperature": 0, "return_token_ids": True})
            assert r.status_code == 200, r.text
            k = min(_decided(ref), 8)
            assert r.json()["choices"][0]["token_ids"][:k] == ref["greedy_ids"][:k]
        names = sorted(m["id"] for m in srv.health()["models"])
        assert names == ["q4", "q6"]
        metrics = requests.get(srv.url + "/metrics", timeout=30).text
        assert 'model="q4"' in metrics and 'model="q6"' in metrics
    finally:
        srv.stop()
