"""batch_invariant: false seen from outside (docs/configuration.md, "Batch
invariance and fast prefill"): dolphind says at start-up whether prefill runs
on AMX and in which arithmetic (BF16x3 for F16, AMX-INT8 for weights on 8-bit
activations: load-time nf4, a GGUF Q4_K_M file), and where it does, a long
prompt's logprobs stay within 5e-3 of the batch-invariant server's, and the
config-file key does the same as the flag."""
import os
import re
import tempfile

import pytest

from dolphin_server import Dolphind, gguf_file, model_dir

# A prompt of well over 16 tokens, so its prefill takes the tile path.
PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play "
          "outside in the park with her friends, and every day she found a new game.")


def amx_here(arithmetic="bf16x3"):
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    need = ("amx_bf16", "amx_tile", "avx512_bf16") if arithmetic == "bf16x3" else ("amx_int8", "amx_tile")
    return all(re.search(r"\b%s\b" % f, flags) for f in need)


def top_logprobs(srv):
    r = srv.complete({"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 5})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    return lp["tokens"], lp["top_logprobs"]


def started_fast(log):
    if "event=cpu_fast_prefill " in log:
        return True
    assert "event=cpu_fast_prefill_unavailable" in log, log[-4000:]
    return False


@pytest.mark.parametrize("weights,arithmetic", [("f16", "bf16x3"), ("nf4", "int8"), ("gguf", "int8")])
def test_logprobs_close_to_exact(weights, arithmetic):
    model, args = "tiny-llama2", ["--weights", weights]
    if weights == "gguf":
        model, args = str(gguf_file("tiny-llama2-Q4_K_M.gguf")), []
    if arithmetic == "int8":  # the harness pins f32 activations otherwise
        args += ["--activations", "int8"]
    exact = Dolphind(model, args)
    try:
        assert "event=cpu_fast_prefill" not in exact.log()
        want_tokens, want = top_logprobs(exact)
    finally:
        exact.stop()
    fast = Dolphind(model, args + ["--no-batch-invariant"])
    try:
        log = fast.log()
        assert started_fast(log) == amx_here(arithmetic)
        if amx_here(arithmetic):
            assert "arithmetic=%s " % arithmetic in log, log[-3000:]
        tokens, got = top_logprobs(fast)
    finally:
        fast.stop()
    # The first token's distribution comes from the prefill itself. The
    # products are within ~2^-16 of sum |x w| each; through the layers that
    # moved these logprobs by up to 1.3e-3 here (F32 rounding amplified, not
    # a different distribution): the likeliest token is the same and every
    # token both top-5 lists hold is within 5e-3.
    assert tokens[0] == want_tokens[0]
    shared = set(got[0]) & set(want[0])
    assert len(shared) >= 4, (got[0], want[0])
    for tok in shared:
        assert abs(got[0][tok] - want[0][tok]) <= 5e-3, (tok, got[0][tok], want[0][tok])


def test_config_key():
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write("model: %s\nbatch_invariant: false\n" % model_dir("tiny-llama2"))
        path = f.name
    try:
        srv = Dolphind(None, ["--config", path])
        try:
            assert started_fast(srv.log()) == amx_here()
        finally:
            srv.stop()
    finally:
        os.unlink(path)


def test_f32_weights_stay_exact():
    """F32 weights keep the exact kernels, and the start-up log says why."""
    srv = Dolphind("stories260K", ["--no-batch-invariant"])
    try:
        log = srv.log()
        assert "event=cpu_fast_prefill " not in log
        assert "event=cpu_fast_prefill_unavailable" in log and "reason=f32_weights" in log, log[-3000:]
    finally:
        srv.stop()
