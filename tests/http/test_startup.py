"""tests/http/test_startup.py — dolphind as a process: broken checkpoints and
configs are refused with one line naming the file and the tensor/field and a
non-zero exit (1 for a broken model, 2 for a bad config or flag); --help
exits 0. Damaged copies of the fixtures are made in a temp folder."""
import json
import os
import shutil
import struct
import subprocess
import tempfile

import pytest

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
    expect_refusal(d, "model.safetensors")


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
    expect_refusal(d, "model-00002-of-00002.safetensors")


def test_unsupported_config_values(tmpdir_):
    for field, value, needle in [("rope_scaling", {"type": "linear", "factor": 2.0}, "rope_scaling"),
                                 ("hidden_act", "gelu", "hidden_act"),
                                 ("architectures", ["MistralForCausalLM"], "architectures"),
                                 ("attention_bias", True, "attention_bias")]:
        d = copy_model(STORIES, os.path.join(tmpdir_, field))
        p = os.path.join(d, "config.json")
        cfg = json.load(open(p))
        cfg[field] = value
        json.dump(cfg, open(p, "w"))
        expect_refusal(d, "config.json", needle)


def test_missing_config_field(tmpdir_):
    d = copy_model(STORIES, os.path.join(tmpdir_, "m"))
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    del cfg["num_hidden_layers"]
    json.dump(cfg, open(p, "w"))
    expect_refusal(d, "config.json", "num_hidden_layers")


def test_missing_model_dir(tmpdir_):
    expect_refusal(os.path.join(tmpdir_, "nope"), "config.json")


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
