"""tests/http/test_startup.py — dolphind as a process: broken checkpoints and
configs are refused with one line naming the file (by the path given) and the
tensor/field and a non-zero exit (1 for a broken model or a tokenizer that
does not fit it, 2 for a bad config or flag, or a setting the model rules
out); SIGTERM/SIGINT while the model loads ends it at once with exit 0;
--help exits 0. Damaged copies of the fixtures are made in a temp folder."""
import json
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time

import pytest

from dolphin_server import Dolphind

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("DOLPHIN_SHARED", os.path.join(ROOT, "..", "shared"))
BIN = os.environ.get("DOLPHIN_BIN", os.path.join(ROOT, "build", "dolphind"))
STORIES = os.path.join(SHARED, "models", "stories260K")
TINY = os.path.join(SHARED, "models", "tiny-llama2")

pytestmark = pytest.mark.skipif(not os.path.isdir(STORIES), reason=f"fixtures not found under {SHARED}")


def run(*args, timeout=60):
    p = subprocess.run([BIN, "--port", "0", "--threads", "1", *args], capture_output=True,
                       text=True, timeout=timeout)
    return p.returncode, p.stderr


def error_lines(stderr):
    # structured log lines (ts=...) are not the error; the error is the rest
    return [l for l in stderr.splitlines() if l.strip() and not l.startswith("ts=")]


@pytest.fixture
def tmpdir_():
    d = tempfile.mkdtemp(prefix="dolphin-startup-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def copy_model(src, dst):
    shutil.copytree(src, dst)
    for f in os.listdir(dst):
        os.chmod(os.path.join(dst, f), 0o644)
    return dst


def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path, header, data):
    js = json.dumps(header).encode()
    js += b" " * ((8 - len(js) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + data)


def expect_refusal(model_dir, *needles, code=1):
    rc, err = run("--model", model_dir)
    lines = error_lines(err)
    assert rc == code, err
    assert len(lines) == 1, f"expected one line, got: {lines}"
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


def test_truncated_file(tmpdir_):
    d = copy_model(STORIES, os.path.join(tmpdir_, "m"))
    p = os.path.join(d, "model.safetensors")
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(size // 2)
    line = expect_refusal(d, "model.safetensors")
    assert line.startswith(f"dolphind: {p}: "), line   # the path as given, not the bare name


def test_truncated_inside_header(tmpdir_):
    d = copy_model(STORIES, os.path.join(tmpdir_, "m"))
    p = os.path.join(d, "model.safetensors")
    with open(p, "r+b") as f:
        f.truncate(100)
    expect_refusal(d, "model.safetensors")


def test_corrupt_header_json(tmpdir_):
    d = copy_model(STORIES, os.path.join(tmpdir_, "m"))
    p = os.path.join(d, "model.safetensors")
    with open(p, "r+b") as f:
        f.seek(8)
        f.write(b"{\"oops\": [")
    expect_refusal(d, "model.safetensors")


def test_offsets_past_end(tmpdir_):
    d = copy_model(STORIES, os.path.join(tmpdir_, "m"))
    p = os.path.join(d, "model.safetensors")
    h, data = read_st(p)
    h["model.norm.weight"]["data_offsets"][1] = len(data) + 1024
    write_st(p, h, data)
    expect_refusal(d, "model.safetensors", "model.norm.weight")


def test_overlapping_offsets(tmpdir_):
    d = copy_model(STORIES, os.path.join(tmpdir_, "m"))
    p = os.path.join(d, "model.safetensors")
    h, data = read_st(p)
    a = h["model.layers.0.input_layernorm.weight"]["data_offsets"]
    b = h["model.layers.0.post_attention_layernorm.weight"]
    b["data_offsets"] = [a[0], a[1]]
    write_st(p, h, data)
    expect_refusal(d, "model.safetensors", "overlap")


def test_missing_tensor(tmpdir_):
    d = copy_model(STORIES, os.path.join(tmpdir_, "m"))
    p = os.path.join(d, "model.safetensors")
    h, data = read_st(p)
    del h["model.layers.3.mlp.down_proj.weight"]
    write_st(p, h, data)
    expect_refusal(d, "model.layers.3.mlp.down_proj.weight")


def test_wrong_shape(tmpdir_):
    d = copy_model(STORIES, os.path.join(tmpdir_, "m"))
    p = os.path.join(d, "model.safetensors")
    h, data = read_st(p)
    t = h["model.layers.1.self_attn.q_proj.weight"]
    r, c = t["shape"]
    t["shape"] = [c, r] if r != c else [r // 2, c * 2]
    if r == c:
        t["shape"] = [r // 2, c * 2]
    write_st(p, h, data)
    expect_refusal(d, "model.safetensors", "model.layers.1.self_attn.q_proj.weight", "shape")


def test_unsupported_dtype(tmpdir_):
    d = copy_model(STORIES, os.path.join(tmpdir_, "m"))
    p = os.path.join(d, "model.safetensors")
    h, data = read_st(p)
    t = h["model.layers.2.mlp.up_proj.weight"]
    r, c = t["shape"]
    t["dtype"] = "I32"  # same size as F32, so only the dtype is wrong
    write_st(p, h, data)
    expect_refusal(d, "model.layers.2.mlp.up_proj.weight", "I32")


def test_missing_shard(tmpdir_):
    d = copy_model(TINY, os.path.join(tmpdir_, "m"))
    os.remove(os.path.join(d, "model-00002-of-00002.safetensors"))
    expect_refusal(d, os.path.join(d, "model-00002-of-00002.safetensors") + ": cannot open")


def test_unsupported_config_values(tmpdir_):
    for field, value, needle in [("rope_scaling", {"type": "linear", "factor": 2.0}, "rope_scaling"),
                                 ("hidden_act", "gelu", "hidden_act"),
                                 ("architectures", ["MistralForCausalLM"], "architectures"),
                                 ("attention_bias", True, "attention_bias"),
                                 ("model_type", "mistral", "model_type")]:
        d = copy_model(STORIES, os.path.join(tmpdir_, field))
        p = os.path.join(d, "config.json")
        cfg = json.load(open(p))
        cfg[field] = value
        json.dump(cfg, open(p, "w"))
        expect_refusal(d, os.path.join(d, "config.json") + ": field " + needle)


def test_missing_config_field(tmpdir_):
    d = copy_model(STORIES, os.path.join(tmpdir_, "m"))
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    del cfg["num_hidden_layers"]
    json.dump(cfg, open(p, "w"))
    expect_refusal(d, "config.json", "num_hidden_layers")


def test_fewer_layers_than_the_weights(tmpdir_):
    # stories260K stores 5 layers; a config saying 4 would silently drop one
    d = copy_model(STORIES, os.path.join(tmpdir_, "m"))
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    cfg["num_hidden_layers"] = 4
    json.dump(cfg, open(p, "w"))
    expect_refusal(d, p + ": field num_hidden_layers: 4", "model.safetensors", "model.layers.4.")


def test_unknown_weights_value(tmpdir_):
    # an unknown weights value: exit 2, naming it and listing the valid ones
    for args in (["--weights", "int4"], ["--config", os.path.join(tmpdir_, "w.yaml")]):
        with open(os.path.join(tmpdir_, "w.yaml"), "w") as f:
            f.write("weights: int4\n")
        rc, err = run("--model", STORIES, *args)
        lines = error_lines(err)
        assert rc == 2, err
        assert len(lines) == 1, lines
        assert "weights" in lines[0] and "int4" in lines[0], lines[0]
        assert "auto|f32|f16|nf4|int8" in lines[0], lines[0]


def add_tensor(path, name, dtype, shape, nbytes):
    h, data = read_st(path)
    begin = len(data)
    h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, begin + nbytes]}
    write_st(path, h, data + bytes(nbytes))


def test_prequantized_checkpoints_are_refused(tmpdir_):
    # tensors that another quantizer (bitsandbytes, GPTQ, AWQ) leaves next to
    # or instead of the weights: refused at load, naming file, tensor and kind
    w = "model.layers.1.self_attn.q_proj"
    for i, (name, dtype, shape, nbytes, kind) in enumerate([
            (w + ".weight.absmax", "F32", [64], 256, "bitsandbytes"),
            (w + ".weight.quant_map", "F32", [16], 64, "bitsandbytes"),
            (w + ".weight.quant_state.bitsandbytes__nf4", "U8", [32], 32, "bitsandbytes"),
            (w + ".qweight", "I32", [8, 64], 2048, "GPTQ/AWQ"),
            (w + ".qzeros", "I32", [1, 8], 32, "GPTQ/AWQ"),
            (w + ".scales", "F16", [1, 64], 128, "GPTQ/AWQ")]):
        d = copy_model(STORIES, os.path.join(tmpdir_, f"m{i}"))
        st = os.path.join(d, "model.safetensors")
        add_tensor(st, name, dtype, shape, nbytes)
        line = expect_refusal(d, st, "tensor " + name, kind, "already quantized")
        assert line.count(name) == 1, line


def test_quantization_config_is_refused(tmpdir_):
    d = copy_model(STORIES, os.path.join(tmpdir_, "m"))
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    json.dump(cfg, open(p, "w"))
    expect_refusal(d, p + ": field quantization_config", "gptq", "already quantized")


def test_missing_model_dir(tmpdir_):
    d = os.path.join(tmpdir_, "nope")
    line = expect_refusal(d, "config.json")
    assert line == f"dolphind: {d}/config.json: cannot open: No such file or directory", line


def test_tokenizer_of_another_model(tmpdir_):
    # Llama-2's 32000-piece tokenizer next to a 512-token model: every request
    # would fail, so start-up refuses it, naming both files and both numbers
    d = copy_model(STORIES, os.path.join(tmpdir_, "m"))
    shutil.copyfile(os.path.join(TINY, "tokenizer.model"), os.path.join(d, "tokenizer.model"))
    expect_refusal(d, os.path.join(d, "tokenizer.model"), "32000",
                   os.path.join(d, "config.json"), "vocab_size 512")


def test_default_max_tokens_must_fit_the_context(tmpdir_):
    # the default max_tokens (used by completions that give none) at or above
    # the context would make each of them 400: a config error (exit 2)
    for args, needles in [(["--max-tokens", "1000"], ["max_tokens 1000", "512"]),
                          (["--max-tokens", "512"], ["max_tokens 512", "512"]),
                          (["--max-tokens", "100", "--context-len", "64"],
                           ["max_tokens 100", "64", "context_len"]),
                          (["--max-tokens", "1000", "--max-tokens-cap", "600"],
                           ["max_tokens_cap 600", "512"])]:
        rc, err = run("--model", STORIES, *args)
        lines = error_lines(err)
        assert rc == 2, (args, err)
        assert len(lines) == 1, (args, lines)
        for n in needles:
            assert n in lines[0], (args, n, lines[0])
    cfg = os.path.join(tmpdir_, "c.yaml")
    with open(cfg, "w") as f:
        f.write("max_tokens: 700\n")
    rc, err = run("--config", cfg, "--model", STORIES)
    assert rc == 2 and "max_tokens 700" in err, err


def test_context_len_clamp_is_logged():
    # clamped to max_position_embeddings with a warning naming both numbers;
    # max_tokens_cap brings the default max_tokens within the context
    srv = Dolphind(STORIES, ["--context-len", "100000", "--max-tokens", "1000",
                             "--max-tokens-cap", "8", "--no-warmup"], threads=1)
    try:
        warn = [l for l in srv.log().splitlines() if "event=context_len_clamped" in l]
        assert len(warn) == 1 and "level=warn" in warn[0], srv.log()
        assert "context_len=100000" in warn[0] and "max_position_embeddings=512" in warn[0]
        r = srv.complete({"model": srv.model, "prompt": "Once upon a time"})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] <= 8
    finally:
        srv.stop()


def fifo_model(tmpdir_):
    """stories260K whose model.safetensors is a FIFO no one writes: opening it
    blocks, as a hung network mount would."""
    d = os.path.join(tmpdir_, "fifo")
    os.mkdir(d)
    for f in ("config.json", "tokenizer.model"):
        os.symlink(os.path.join(STORIES, f), os.path.join(d, f))
    os.mkfifo(os.path.join(d, "model.safetensors"))
    return d


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_while_loading_stops_at_once(tmpdir_, sig):
    d = fifo_model(tmpdir_)
    p = subprocess.Popen([BIN, "--port", "0", "--threads", "1", "--model", d],
                         stderr=subprocess.PIPE, text=True)
    try:
        first = p.stderr.readline()
        assert "event=listening" in first, first
        time.sleep(0.3)   # into the blocking open of the FIFO
        assert p.poll() is None
        p.send_signal(sig)
        _, rest = p.communicate(timeout=5)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, rest
    lines = [l for l in rest.splitlines() if l.strip()]
    assert len(lines) == 1, lines
    assert "event=stopping" in lines[0] and f"signal={sig.name}" in lines[0] \
        and "during=start-up" in lines[0], lines


def test_bad_config_file_and_flags(tmpdir_):
    cfg = os.path.join(tmpdir_, "bad.yaml")
    with open(cfg, "w") as f:
        f.write("port: 8080\nmax_batch_size: many\n")
    rc, err = run("--config", cfg, "--model", STORIES)
    assert rc == 2
    lines = error_lines(err)
    assert len(lines) == 1 and "bad.yaml:2" in lines[0] and "max_batch_size" in lines[0], lines
    rc, err = run("--model", STORIES, "--frobnicate", "1")
    assert rc == 2 and "--frobnicate" in err
    rc, err = run("--model", STORIES, "--max-batch-size", "0")
    assert rc == 2 and "--max-batch-size" in err


def test_help_lists_flags():
    p = subprocess.run([BIN, "--help"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 0
    for flag in ("--config", "--model", "--host", "--port", "--threads", "--max-batch-size",
                 "--batch-window-ms", "--batch-mode", "--max-queue", "--kv-cache-tokens"):
        assert flag in p.stdout, flag


def test_placement_settings_without_a_gpu_are_named_not_dropped():
    # no CUDA device here (or no CUDA in this build): the whole model runs on
    # the CPU and the placement keys that were set are named in a warning
    srv = Dolphind(STORIES, ["--gpu-layers", "3", "--devices", "0,1", "--no-warmup"], threads=1)
    try:
        warn = [l for l in srv.log().splitlines() if "event=placement_ignored" in l]
        assert len(warn) == 1 and "level=warn" in warn[0], srv.log()
        assert "devices=2" in warn[0] and "gpu_layers=3" in warn[0]
        assert srv.complete({"model": srv.model, "prompt": "Once", "max_tokens": 2}).status_code == 200
    finally:
        srv.stop()
    # backend: cpu with blocks asked on a GPU is a contradiction: exit 2
    code, err = run("--model", STORIES, "--backend", "cpu", "--gpu-layers", "2")
    assert code == 2 and "gpu_layers" in err, err
    # backend: cuda: exit 2 when this build has no CUDA at all (a setting it can
    # never honour), 1 when it has but finds no device (the machine's state)
    code, err = run("--model", STORIES, "--backend", "cuda")
    assert code == (2 if "built without CUDA" in err else 1), (code, err)


def test_kv_cache_bytes_below_one_token_is_one_block():
    srv = Dolphind(STORIES, ["--kv-cache-bytes", "1", "--no-warmup", "--max-tokens", "4"], threads=1)
    try:
        line = [l for l in srv.log().splitlines() if "event=model_loaded" in l][0]
        assert "kv_blocks=1 " in line, line
    finally:
        srv.stop()
