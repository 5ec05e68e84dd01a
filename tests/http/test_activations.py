"""The activations setting end to end: the default (auto) runs 8-bit
activations on quantized weights where the CPU has an int8 kernel set and
says so in /v1/models (dolphin.activations) and in the cpu_activations
start-up line; f32 asked, F16 weights and per-model entries keep the exact
products; its answers hold the reference's greedy ids up to the first step
whose margin is below the int8 path's error; a bad value exits 2 naming
the flag or the file and field."""
import subprocess

import pytest
import requests

from dolphin_server import BIN, Dolphind, golden, gguf_file, model_dir

# int8 activations move the logits of the fixtures by about this much (test_i8's
# KL figures); below this margin the reference's greedy choice is not held
INT8_MARGIN = 0.05


def _activations(srv, model=None):
    data = requests.get(srv.url + "/v1/models", timeout=30).json()["data"]
    m = data[0] if model is None else next(d for d in data if d["id"] == model)
    return m["dolphin"]["activations"]


def _int8_here(srv):
    """Whether this CPU has an int8 kernel set (the log says which path runs)."""
    return "no_int8_kernels" not in srv.log()


def _decided(case, margin):
    for k, m in enumerate(case["greedy_margins"]):
        if m < margin:
            return k
    return len(case["greedy_ids"])


def test_default_is_int8_on_quantized_weights():
    srv = Dolphind(str(gguf_file("tiny-llama2-Q4_K_M.gguf")), ["--activations", "auto"], threads=2)
    try:
        want = "int8" if _int8_here(srv) else "f32"
        assert _activations(srv) == want
        assert f"event=cpu_activations activations={want}" in srv.log()
        if want == "int8":
            assert "reason=auto" in srv.log()
        # the reference's greedy ids hold where its margins are wide
        ref = golden("gguf-tiny-llama2")["files"]["Q4_K_M"]["reference"]["cases"]
        for case in ref:
            r = srv.complete({"model": srv.model, "prompt": case["prompt"],
                              "max_tokens": len(case["greedy_ids"]), "temperature": 0,
                              "return_token_ids": True})
            assert r.status_code == 200, r.text
            k = _decided(case, INT8_MARGIN)
            assert r.json()["choices"][0]["token_ids"][:k] == case["greedy_ids"][:k]
    finally:
        srv.stop()


def test_load_time_nf4_default_and_f32_asked():
    for args, want in ((["--weights", "nf4", "--activations", "auto"], None),
                       (["--weights", "nf4", "--activations", "f32"], "f32"),
                       (["--weights", "int8", "--activations=int8"], None)):
        srv = Dolphind("k256", args, threads=1)
        try:
            exp = want or ("int8" if _int8_here(srv) else "f32")
            assert _activations(srv) == exp, args
            r = srv.complete({"model": srv.model, "prompt": "Hello", "max_tokens": 4,
                              "temperature": 0})
            assert r.status_code == 200, r.text
        finally:
            srv.stop()


def test_unquantized_weights_keep_f32():
    srv = Dolphind(str(gguf_file("k256-F16.gguf")), ["--activations", "int8"], threads=1)
    try:
        assert _activations(srv) == "f32"
        assert "reason=weights_not_quantized" in srv.log()
    finally:
        srv.stop()


def test_per_model_entries(tmp_path):
    """A models: entry's own activations wins over the top-level value."""
    a, b = gguf_file("k256-Q4_0.gguf"), gguf_file("k256-Q8_0.gguf")
    cfg = tmp_path / "dolphin.yaml"
    cfg.write_text(f"activations: auto\nmodels:\n  - name: q4\n    path: {a}\n"
                   f"  - name: q8\n    path: {b}\n    activations: f32\n")
    srv = Dolphind(None, ["--config", str(cfg)], threads=1)
    try:
        assert _activations(srv, "q4") == ("int8" if _int8_here(srv) else "f32")
        assert _activations(srv, "q8") == "f32"
    finally:
        srv.stop()


def _start_fails(args):
    if not BIN.is_file():
        pytest.skip(f"{BIN} not built")
    return subprocess.run([str(BIN), "--model", str(model_dir("k256")), "--port", "0",
                           "--threads", "1", *args], capture_output=True, text=True, timeout=120)


def test_bad_flag_exit_2():
    p = _start_fails(["--activations", "int4"])
    assert p.returncode == 2, p.stderr
    assert "--activations" in p.stderr and "int4" in p.stderr, p.stderr


def test_bad_config_value_exit_2(tmp_path):
    cfg = tmp_path / "dolphin.yaml"
    cfg.write_text("activations: fp8\n")
    p = _start_fails(["--config", str(cfg)])
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert str(cfg) in last and "activations" in last, last
