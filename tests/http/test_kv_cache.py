"""The 8-bit KV cache through the server (docs/configuration.md, "The KV
pool"): kv_cache_dtype q8_0 and the per-half keys from flags, the YAML file
and a models: entry; what /healthz, /metrics and the model_loaded line say;
the pool a byte budget buys against f16; completions (greedy, n > 1 forks,
prefix-cache hits, streaming) on the 8-bit cache; bad settings exit 2
naming the key.

The arithmetic itself (ids and NLL against the F32 cache on every fixture
and GGUF file, batch invariance) is tests/unit/test_kv_q8.c."""
import json
import re
import shutil
import struct
import subprocess

import pytest
import requests

from dolphin_server import BIN, SHARED, Dolphind, model_dir

BUDGET = 8 << 20   # kv_cache_bytes: the same budget for every dtype


def _kv(d):
    return d.health()["kv_cache"]


def _greedy(d, prompt, max_tokens=24, **extra):
    r = d.complete({"model": d.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_q8_0_pool_and_reports():
    """q8_0 on k256 (heads of 32): at least 1.85 x the tokens of f16 from
    the same kv_cache_bytes, as /healthz reports them; the model_loaded
    line and /metrics give the dtype, tokens and full contexts."""
    tokens = {}
    for dt in ("f16", "q8_0"):
        d = Dolphind("k256", ["--kv-cache-dtype", dt, "--kv-cache-bytes", BUDGET])
        try:
            kv = _kv(d)
            assert kv["dtype"] == dt and kv["dtype_k"] == dt and kv["dtype_v"] == dt, kv
            tokens[dt] = kv["tokens_total"]
            m = re.search(r"event=model_loaded .*kv_cache_dtype=(\S+) kv_cache_dtype_k=(\S+) "
                          r"kv_cache_dtype_v=(\S+) kv_tokens=(\d+) kv_contexts=([\d.]+)", d.log())
            assert m and m.group(1) == m.group(2) == m.group(3) == dt, d.log()[-3000:]
            assert int(m.group(4)) == kv["tokens_total"]
            metrics = requests.get(d.url + "/metrics", timeout=30).text
            assert re.search(r'^dolphin_kv_cache_info\{model="k256",dtype_k="%s",dtype_v="%s"\} 1$'
                             % (dt, dt), metrics, re.M), metrics
            cap = re.search(r'^dolphin_kv_cache_tokens_capacity\{model="k256"\} (\S+)$', metrics, re.M)
            ctx = re.search(r'^dolphin_kv_cache_full_contexts\{model="k256"\} (\S+)$', metrics, re.M)
            assert cap and float(cap.group(1)) == kv["tokens_total"], metrics
            assert ctx and abs(float(ctx.group(1)) - kv["full_contexts"]) < 1e-9, metrics
            if dt == "q8_0":
                out = _greedy(d, "Once upon a time")
                assert out["usage"]["completion_tokens"] > 0
        finally:
            d.stop()
    assert tokens["q8_0"] >= 1.85 * tokens["f16"], tokens


def test_greedy_matches_f32_cache_and_features():
    """stories260K (a trained model): greedy text with a q8_0 cache equals
    the F32 cache's on the golden prompts (their margins stay above 0.05 for
    these 8 tokens; the unit test checks every fixture up to its first
    low-margin step); n = 3 forks of one prompt, a prefix-cache hit and a
    stream give the same text as the plain request."""
    gold = json.loads((SHARED / "golden" / "stories260K.json").read_text())
    prompts = [c["prompt"] for c in gold["cases"]]
    texts = {}
    for dt in ("f32", "q8_0"):
        d = Dolphind("stories260K", ["--kv-cache-dtype", dt, "--kv-cache-tokens", 4096])
        try:
            texts[dt] = [_greedy(d, p, 8)["choices"][0]["text"] for p in prompts]
            if dt == "q8_0":
                long = " ".join(prompts)           # several KV blocks: cacheable
                base = _greedy(d, long, 24)["choices"][0]["text"]
                forks = _greedy(d, long, 24, n=3)["choices"]
                assert [c["text"] for c in forks] == [base] * 3
                again = _greedy(d, long, 24)
                assert again["choices"][0]["text"] == base
                h = d.health()
                assert h["kv_cache"]["dtype"] == "q8_0"
                r = d.complete({"model": d.model, "prompt": long, "max_tokens": 24,
                                "temperature": 0, "stream": True}, stream=True)
                assert r.status_code == 200
                streamed = ""
                for line in r.iter_lines():
                    if line.startswith(b"data: ") and line != b"data: [DONE]":
                        streamed += json.loads(line[6:])["choices"][0]["text"]
                assert streamed == base
                metrics = requests.get(d.url + "/metrics", timeout=30).text
                hits = re.search(r'^dolphin_prefix_cache_hits_total\{model="[^"]+"\} (\S+)$', metrics, re.M)
                assert hits and float(hits.group(1)) > 0, metrics
        finally:
            d.stop()
    assert texts["q8_0"] == texts["f32"], texts


def test_halves_from_yaml_and_model_entries(tmp_path):
    """kv_cache_dtype_k / _v from the YAML file, and per model in a models:
    list (one model q8_0, the other f16 with an 8-bit K half)."""
    cfg = tmp_path / "kv.yaml"
    cfg.write_text("kv_cache_dtype_k: q8_0\nkv_cache_tokens: 512\n")
    d = Dolphind("stories260K", ["--config", cfg])
    try:
        kv = _kv(d)
        # the V half as auto resolves it: f32 with these F32 weights on the
        # CPU, f16 on CUDA
        v = kv["dtype_v"]
        assert v in ("f32", "f16") and kv["dtype_k"] == "q8_0", kv
        assert kv["dtype"] == f"k=q8_0,v={v}", kv
        assert f'kv_cache_dtype="k=q8_0,v={v}"' in d.log()
        assert _greedy(d, "Once upon a time", 8)["usage"]["completion_tokens"] > 0
    finally:
        d.stop()
    cfg.write_text(f"""kv_cache_tokens: 512
models:
  - name: a
    path: {model_dir('stories260K')}
    kv_cache_dtype: q8_0
  - name: b
    path: {model_dir('tiny-llama2')}
    kv_cache_dtype: f16
    kv_cache_dtype_k: q8_0
""")
    d = Dolphind(None, ["--config", cfg])
    try:
        for name in ("a", "b"):
            r = d.complete({"model": name, "prompt": "Once", "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200, r.text
        by = {m["id"]: m["kv_cache"] for m in d.health()["models"] if "kv_cache" in m}
        assert by["a"]["dtype"] == "q8_0", by
        assert by["b"]["dtype"] == "k=q8_0,v=f16", by
        metrics = requests.get(d.url + "/metrics", timeout=30).text
        assert 'dolphin_kv_cache_info{model="a",dtype_k="q8_0",dtype_v="q8_0"} 1' in metrics
        assert 'dolphin_kv_cache_info{model="b",dtype_k="q8_0",dtype_v="f16"} 1' in metrics
    finally:
        d.stop()


def _run(*args, timeout=120):
    if not BIN.is_file():
        pytest.skip(f"{BIN} not built")
    return subprocess.run([str(BIN), "--port", "0", "--threads", "1", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def _write_st(path, tensors):
    """A safetensors file of F32 tensors {name: (shape, fill)}."""
    header, blobs, off = {}, [], 0
    for name, (shape, fill) in tensors.items():
        n = 1
        for s in shape:
            n *= s
        data = struct.pack(f"<{n}f", *(fill(i) for i in range(n)))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def _model_with_heads_of(tmp_path, head_dim):
    """A one-layer random checkpoint with two heads of head_dim values (the
    stories260K tokenizer)."""
    src = model_dir("stories260K")
    out = tmp_path / f"hd{head_dim}"
    out.mkdir()
    shutil.copy(src / "tokenizer.model", out / "tokenizer.model")
    d, f, V = 2 * head_dim, 96, 512
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(hidden_size=d, intermediate_size=f, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=2, tie_word_embeddings=False)
    (out / "config.json").write_text(json.dumps(cfg))
    r = lambda i: ((i * 2654435761) % 1000) / 1000.0 - 0.5   # noqa: E731
    one = lambda i: 1.0                                        # noqa: E731
    p = "model.layers.0."
    _write_st(out / "model.safetensors", {
        "model.embed_tokens.weight": ([V, d], r), "model.norm.weight": ([d], one),
        "lm_head.weight": ([V, d], r), p + "input_layernorm.weight": ([d], one),
        p + "post_attention_layernorm.weight": ([d], one),
        p + "self_attn.q_proj.weight": ([d, d], r), p + "self_attn.k_proj.weight": ([d, d], r),
        p + "self_attn.v_proj.weight": ([d, d], r), p + "self_attn.o_proj.weight": ([d, d], r),
        p + "mlp.gate_proj.weight": ([f, d], r), p + "mlp.up_proj.weight": ([f, d], r),
        p + "mlp.down_proj.weight": ([d, f], r)})
    return out


def test_bad_settings_exit_2(tmp_path):
    """An unknown dtype (flag or YAML) and q8_0 on heads of 40 (neither
    below 32 nor a multiple of it): exit 2, one line naming the key; the
    same model starts with f16."""
    for args in (["--kv-cache-dtype", "q4_0"], ["--kv-cache-dtype-v", "int8"]):
        p = _run("--model", model_dir("stories260K"), *args)
        assert p.returncode == 2, p.stderr
        assert args[0] in p.stderr and args[1] in p.stderr, p.stderr
        assert "q8_0" in p.stderr, p.stderr      # the valid choices are listed
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("kv_cache_dtype_k: fp8\n")
    p = _run("--model", model_dir("stories260K"), "--config", cfg)
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert str(cfg) in last and "kv_cache_dtype_k" in last and "fp8" in last, last

    m = _model_with_heads_of(tmp_path, 40)
    for args, key in ((["--kv-cache-dtype", "q8_0"], "kv_cache_dtype:"),
                      (["--kv-cache-dtype-k", "q8_0"], "kv_cache_dtype_k:")):
        p = _run("--model", m, "--kv-cache-tokens", 64, *args)
        assert p.returncode == 2, p.stderr
        assert key in p.stderr and "head_dim is 40" in p.stderr, p.stderr
    d = Dolphind(m, ["--kv-cache-dtype", "f16", "--kv-cache-tokens", 64])
    try:
        assert _kv(d)["dtype"] == "f16"
    finally:
        d.stop()
