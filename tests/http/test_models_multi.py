"""Several models in one server (docs/configuration.md, "Several models"):
three entries (stories260K F32, tiny-llama2 F16, stories260K NF4 under
another name) and a broken one, at most two loaded. Interleaved requests
give each model's golden output; loads and unloads happen least recently
used first; a model with a request in flight is never unloaded; concurrent
first requests share one load, and a burst for more models than fit loads
each once; the broken entry gets 503 with the reason
while the others serve; memory comes back when a model is unloaded; when
nothing can be unloaded the request waits, then gets 503 with Retry-After."""
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from dolphin_server import Dolphind, check_error, golden, model_dir, parse_sse, stream_texts

SMALL_MARGIN = 1e-3
# Dolphin's NF4 rounds differently from the float64 reference's NF4 (the
# golden file's): they agree up to the first step whose margin is below this.
NF4_MARGIN = 0.7
NAMES = ["stories", "tiny", "stories-nf4", "broken"]
RETRY_S = 3   # load_retry_s of the broken entry


def write_config(tmp, text):
    p = Path(tmp) / "models.yaml"
    p.write_text(text)
    return p


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multi")
    broken = tmp / "broken-ckpt"
    broken.mkdir()
    (broken / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_')
    cfg = write_config(tmp, f"""
models:
  - name: stories
    path: "{model_dir('stories260K')}"
    weights: f32
  - name: tiny
    path: "{model_dir('tiny-llama2')}"
    weights: f16
  - name: stories-nf4
    path: "{model_dir('stories260K')}"
    weights: nf4
    aliases: [small, fast]
  - name: broken
    path: "{broken}"
max_loaded_models: 2
load_retry_s: {RETRY_S}
""")
    srv = Dolphind(None, ["--config", cfg])
    yield srv
    srv.stop()


def complete(srv, model, prompt, max_tokens, **kw):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, **kw}
    if model:
        body["model"] = model
    return srv.complete(body)


def models(srv):
    r = requests.get(srv.url + "/v1/models", timeout=30)
    assert r.status_code == 200, r.text
    return {m["id"]: m for m in r.json()["data"]}


def states(srv):
    return {k: v["dolphin"]["state"] for k, v in models(srv).items()}


def decided(case, tol=SMALL_MARGIN):
    """Steps of a reference that must be reproduced: those before the first
    top-1/top-2 margin below tol."""
    for k, m in enumerate(case["greedy_margins"]):
        if m < tol:
            return k
    return len(case["greedy_ids"])


@pytest.fixture(scope="module")
def nf4_alone():
    """stories260K NF4 served alone by one dolphind: the ids of each golden
    NF4 case in full, checked against the golden file up to NF4_MARGIN."""
    srv = Dolphind("stories260K", ["--weights", "nf4"])
    try:
        out = []
        for c in golden("quant-stories260K")["schemes"]["nf4"]["cases"]:
            r = complete(srv, None, c["prompt"], len(c["greedy_ids"]))
            ids = r.json()["choices"][0]["token_ids"]
            k = decided(c, NF4_MARGIN)
            assert ids[:k] == c["greedy_ids"][:k], c["prompt"]
            out.append(dict(c, greedy_ids=ids))
        return out
    finally:
        srv.stop()


def golden_cases(nf4_cases):
    """(model, case, max_tokens, check) for every golden case of the three:
    stories exactly (F32), tiny up to its first undecided step (F16), NF4 as
    served alone, every token."""
    out = []
    for c in golden("stories260K")["cases"]:
        out.append(("stories", c, len(c["greedy_ids"]), "text"))
    for c in golden("tiny-llama2")["cases"]:
        k = decided(c)
        if k:
            out.append(("tiny", c, k, "ids"))
    for c in nf4_cases:
        out.append(("stories-nf4", c, len(c["greedy_ids"]), "ids"))
    return out


def check_golden(srv, model, case, k, how, name=None):
    r = complete(srv, name or model, case["prompt"], k)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == model
    ch = body["choices"][0]
    if how == "text":
        assert ch["text"] == case["greedy_text"], (model, case["prompt"])
    else:
        assert ch["token_ids"] == case["greedy_ids"][:k], (model, case["prompt"])


def test_lists_every_model(multi):
    ms = models(multi)
    assert list(ms) == NAMES
    for m in ms.values():
        assert m["object"] == "model"
        x = m["dolphin"]
        assert x["state"] in ("loaded", "loading", "unloaded", "failed")
        assert set(x) >= {"state", "format", "placement", "pinned", "aliases", "loads", "unloads"}
    assert ms["stories-nf4"]["dolphin"]["aliases"] == ["small", "fast"]
    assert ms["stories-nf4"]["dolphin"]["format"] == "nf4"
    # the first entry is the start-up model: loaded before /healthz said ready
    assert ms["stories"]["dolphin"]["loads"] >= 1
    r = requests.get(multi.url + "/v1/models/fast", timeout=30)
    assert r.status_code == 200 and r.json()["id"] == "stories-nf4"
    h = multi.health()
    assert h["ready"] and [m["id"] for m in h["models"]] == NAMES


def test_unknown_model_404_lists_names(multi):
    r = complete(multi, "gpt-5", "x", 1)
    err = check_error(r, 404, param="model", code="model_not_found")
    for n in NAMES:
        assert f"'{n}'" in err["message"]


def test_interleaved_golden(multi, nf4_alone):
    """Every golden case of the three models, interleaved one after the
    other (each switch loads a model and unloads another), then all at once
    from 6 threads: each gets exactly its model's reference output."""
    cases = golden_cases(nf4_alone)
    by_model = {}
    for c in cases:
        by_model.setdefault(c[0], []).append(c)
    order = []
    while any(by_model.values()):
        for m in ("stories", "tiny", "stories-nf4"):
            if by_model.get(m):
                order.append(by_model[m].pop(0))
    for model, case, k, how in order:
        check_golden(multi, model, case, k, how)
    # an alias picks the same model
    model, case, k, how = [c for c in cases if c[0] == "stories-nf4"][0]
    check_golden(multi, model, case, k, how, name="small")
    with ThreadPoolExecutor(6) as ex:
        list(ex.map(lambda c: check_golden(multi, *c), cases))


def counters(srv):
    return {k: (v["dolphin"]["loads"], v["dolphin"]["unloads"]) for k, v in models(srv).items()}


def test_loads_and_unloads_least_recently_used(multi):
    def use(m):
        r = complete(multi, m, "Once", 2)
        assert r.status_code == 200, r.text

    def steps(m):   # a scheduler counter of model m on /metrics (None: no sample)
        text = requests.get(multi.url + "/metrics", timeout=30).text
        hit = re.search(r'^dolphin_scheduler_steps_total\{model="%s"\} (\S+)$' % re.escape(m),
                        text, re.M)
        return float(hit.group(1)) if hit else None

    use("stories")
    use("tiny")
    assert states(multi)["stories"] == "loaded" and states(multi)["tiny"] == "loaded"
    before = counters(multi)
    steps_before = steps("stories")
    assert steps_before and steps_before > 0
    use("stories-nf4")        # stories is the least recently used: it goes
    s = states(multi)
    assert s["stories"] == "unloaded" and s["tiny"] == "loaded" and s["stories-nf4"] == "loaded"
    assert steps("stories") == steps_before   # counters stay while it is unloaded
    use("tiny")               # loaded: nothing changes
    use("stories")            # now stories-nf4 is the least recently used
    s = states(multi)
    assert s["stories-nf4"] == "unloaded" and s["tiny"] == "loaded" and s["stories"] == "loaded"
    assert steps("stories") > steps_before    # and carry on after the reload"
    after = counters(multi)
    assert after["stories"] == (before["stories"][0] + 1, before["stories"][1] + 1)
    assert after["stories-nf4"] == (before["stories-nf4"][0] + 1, before["stories-nf4"][1] + 1)
    assert after["tiny"] == before["tiny"]
    # the metrics agree, one series per model
    text = requests.get(multi.url + "/metrics", timeout=30).text
    assert f'dolphin_model_loads_total{{model="stories"}} {after["stories"][0]}' in text
    assert f'dolphin_model_unloads_total{{model="stories-nf4"}} {after["stories-nf4"][1]}' in text
    assert 'dolphin_model_loaded{model="tiny"} 1' in text
    assert 'dolphin_queue_depth{model="tiny"}' in text
    assert 'dolphin_queue_depth{model="stories-nf4"}' not in text   # not loaded
    assert 'dolphin_requests_total{route="/v1/completions",status="200",model="tiny"}' in text
    # the log lines name the model
    log = multi.log()
    assert "event=model_unloaded model=stories reason=max_loaded_models" in log
    assert "route=/v1/completions model=tiny status=200" in log


def test_model_in_use_is_never_unloaded(multi):
    """A long stream holds tiny while the two others take turns: each switch
    unloads the idle one, never tiny; the stream is the same as alone."""
    # nearly the whole 1,024-token context: long enough for a loaded machine
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 1000, "ignore_eos": True,
            "temperature": 0}
    alone = multi.complete(body).json()["choices"][0]["text"]
    out = {}

    def stream():
        with requests.post(multi.url + "/v1/completions", json=dict(body, stream=True),
                           stream=True, timeout=180) as r:
            out["status"] = r.status_code
            out["events"] = parse_sse(r)

    t = threading.Thread(target=stream)
    t.start()
    switches = 0
    try:
        multi.wait_for(lambda h: h["scheduler"]["running_requests"] >= 1, 60, "the stream to run")
        while t.is_alive() and switches < 6:
            for m in ("stories", "stories-nf4"):
                unloads = counters(multi)["tiny"][1]
                r = complete(multi, m, "Once", 2)
                assert r.status_code == 200, r.text
                s, c = states(multi), counters(multi)
                if not t.is_alive():
                    break   # the stream ended meanwhile: tiny may go now
                switches += 1
                assert s["tiny"] == "loaded" and c["tiny"][1] == unloads, (s, c)
    finally:
        t.join(180)
    # one switch already needs an unload while tiny runs (two loaded at most)
    assert switches >= 1, "the stream ended before the others took turns"
    assert out["status"] == 200
    events, done = out["events"]
    assert done and stream_texts(events) == [alone]


def test_concurrent_first_requests_share_one_load(multi):
    # make stories-nf4 unloaded: the two others are the most recent
    for m in ("tiny", "stories"):
        assert complete(multi, m, "Once", 1).status_code == 200
    assert states(multi)["stories-nf4"] == "unloaded"
    loads0 = counters(multi)["stories-nf4"][0]
    with ThreadPoolExecutor(8) as ex:
        rs = list(ex.map(lambda i: complete(multi, "fast" if i % 2 else "stories-nf4",
                                            "Once upon a time", 12), range(8)))
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
    assert len({r.json()["choices"][0]["text"] for r in rs}) == 1
    assert counters(multi)["stories-nf4"][0] == loads0 + 1


def test_broken_entry_503_while_others_serve(multi):
    results = {}

    def broken():
        results["broken"] = complete(multi, "broken", "Once", 4)

    t = threading.Thread(target=broken)
    t.start()
    ok = [complete(multi, m, "Once upon a time", 8) for m in ("stories", "tiny", "stories")]
    t.join(60)
    assert all(r.status_code == 200 for r in ok), [r.text for r in ok]
    err = check_error(results["broken"], 503, code="model_unavailable")
    assert "config.json" in err["message"] and "broken" in err["message"]
    assert results["broken"].headers.get("Retry-After")
    x = models(multi)["broken"]["dolphin"]
    assert x["state"] == "failed" and "config.json" in x["error"] and x["load_failures"] >= 1
    # within the back-off: 503 at once, with the time left (on a slow machine
    # the back-off may have passed: then a new try fails and doubles it)
    r = complete(multi, "broken", "Once", 4)
    check_error(r, 503, code="model_unavailable")
    ra = int(r.headers["Retry-After"])
    assert 1 <= ra <= 4 * RETRY_S, ra
    assert multi.health()["ready"]
    # after it: a new try (which fails again)
    fails = models(multi)["broken"]["dolphin"]["load_failures"]
    time.sleep(ra + 0.5)
    check_error(complete(multi, "broken", "Once", 4), 503, code="model_unavailable")
    assert models(multi)["broken"]["dolphin"]["load_failures"] == fails + 1


def rss_kib(pid):
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssFile", "RssAnon"):
            out[k] = int(v.split()[0])
    return out


def sanitized(pid):
    return "libasan" in Path(f"/proc/{pid}/maps").read_text()


def test_unloading_returns_memory(multi):
    """tiny (17 MB of F16 weights, converted from its files, and its KV
    cache) loaded and then unloaded again: resident memory goes back down."""
    def use(*ms):
        for m in ms:
            assert complete(multi, m, "Once", 2).status_code == 200

    use("tiny", "stories", "stories-nf4")   # tiny loaded once, then unloaded
    use("tiny", "stories", "stories-nf4")
    assert states(multi)["tiny"] == "unloaded"
    base = rss_kib(multi.proc.pid)
    mem_base = multi.health()["memory"]["total_bytes"]
    use("tiny")
    up = rss_kib(multi.proc.pid)
    mem_up = multi.health()["memory"]["total_bytes"]
    use("stories", "stories-nf4")           # tiny unloaded again
    assert states(multi)["tiny"] == "unloaded"
    down = rss_kib(multi.proc.pid)
    mem_down = multi.health()["memory"]["total_bytes"]
    # the weights are converted into memory of their own (17 MB of F16) and
    # the checkpoint's pages dropped once converted, so the file pages do
    # not stay resident, loaded or not ...
    assert up["RssFile"] - base["RssFile"] < 4 * 1024, (base, up)
    assert down["RssFile"] - base["RssFile"] < 1024, (base, up, down)
    assert mem_up > mem_base and mem_down == mem_base   # the KV pools ("device" memory)
    # ASan keeps freed heap in quarantine and hands it out again, so the
    # heap's growth depends on what was freed before: checked without it
    if not sanitized(multi.proc.pid):
        assert up["RssAnon"] - base["RssAnon"] > 12 * 1024, (base, up)
        # ... and the heap: the KV cache (14 MB) and the engine's buffers
        assert up["VmRSS"] - base["VmRSS"] > 12 * 1024, (base, up)
        # (thread stacks and malloc arenas vary by a few MB from one cycle to the next)
        assert down["VmRSS"] - base["VmRSS"] < 8 * 1024, (base, up, down)


def test_no_room_waits_then_503(tmp_path):
    """One model at most, held by a long stream: a request for the other
    waits, then gets 503 with Retry-After; once the stream is gone it loads."""
    cfg = write_config(tmp_path, f"""
models:
  - name: a
    path: "{model_dir('tiny-llama2')}"
  - name: b
    path: "{model_dir('stories260K')}"
    weights: nf4
max_loaded_models: 1
load_timeout_s: 1
""")
    srv = Dolphind(None, ["--config", cfg])
    try:
        # seconds of generation (8 x 1000 tokens: 2 s on 2 cores), holding a
        body = {"model": "a", "prompt": "Once", "max_tokens": 1000, "n": 8, "ignore_eos": True,
                "stream": True}
        with requests.post(srv.url + "/v1/completions", json=body, stream=True,
                           timeout=120) as long:
            assert long.status_code == 200
            t0 = time.monotonic()
            r = complete(srv, "b", "Once", 4)
            waited = time.monotonic() - t0
            err = check_error(r, 503, code="model_unavailable")
            assert "no room" in err["message"] and "max_loaded_models" in err["message"]
            assert r.headers.get("Retry-After") == "1"
            assert waited >= 0.8, waited
            assert states(srv)["a"] == "loaded"
        # hung up: a is idle once its stream is cancelled
        srv.wait_for(lambda h: h["scheduler"]["running_requests"] == 0, 30, "a to be idle")
        time.sleep(1.1)   # the no-room back-off
        r = complete(srv, "b", "Once", 4)
        assert r.status_code == 200, r.text
        assert states(srv) == {"a": "unloaded", "b": "loaded"}
    finally:
        srv.stop()


def test_bad_entry_exits_2(tmp_path):
    import subprocess
    from dolphin_server import BIN
    if not Path(BIN).is_file():
        pytest.skip("dolphind not built")
    for text, want in [
        ("models:\n  - name: a\n    path: /x\n  - name: b\n    path: /y\n    aliases: [a]\n",
         "field models[1] 'b'.aliases: 'a' is already taken by models[0] 'a'"),
        ("models:\n  - name: a\n", "field models[0] 'a'.path: missing"),
        ("models:\n  - name: a\n    path: /x\n    gpu: 1\n", "field models[0] 'a'.gpu: unknown key"),
    ]:
        cfg = write_config(tmp_path, text)
        p = subprocess.run([str(BIN), "--config", str(cfg)], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 2, p
        assert want in p.stderr and str(cfg) in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_memory_budget_unloads(tmp_path):
    """Room for three by count, for one by memory_budget_bytes (each holds
    about 7 MB, mostly its KV cache): loading b unloads a."""
    cfg = write_config(tmp_path, f"""
models:
  - name: a
    path: "{model_dir('stories260K')}"
  - name: b
    path: "{model_dir('stories260K')}"
    weights: nf4
max_loaded_models: 3
memory_budget_bytes: 10MB
""")
    srv = Dolphind(None, ["--config", cfg])
    try:
        assert models(srv)["a"]["dolphin"]["memory_bytes"] > 5_000_000
        assert complete(srv, "b", "Once", 4).status_code == 200
        assert states(srv) == {"a": "unloaded", "b": "loaded"}
        assert "event=model_unloaded model=a reason=memory_budget" in srv.log()
        assert complete(srv, "a", "Once", 4).status_code == 200
        assert states(srv) == {"a": "loaded", "b": "unloaded"}
    finally:
        srv.stop()


def test_burst_shares_loads_without_thrash(tmp_path):
    """Nine requests at once for three models that only fit one at a time
    (the pinned one takes the other place): each model loads once, every
    request is served, and no model is unloaded before the requests it was
    loaded for have run."""
    cfg = write_config(tmp_path, f"""
models:
  - name: s32
    path: "{model_dir('stories260K')}"
    weights: f32
    pinned: true
  - name: t16
    path: "{model_dir('tiny-llama2')}"
    weights: f16
  - name: tnf4
    path: "{model_dir('tiny-llama2')}"
    weights: nf4
  - name: s8
    path: "{model_dir('stories260K')}"
    weights: int8
max_loaded_models: 2
""")
    srv = Dolphind(None, ["--config", cfg])
    try:
        burst = ["s8", "t16", "tnf4"] * 3
        with ThreadPoolExecutor(len(burst)) as ex:
            rs = list(ex.map(lambda m: srv.complete({"model": m, "prompt": "Once",
                                                     "max_tokens": 4}), burst))
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
        c = counters(srv)
        for m in ("s8", "t16", "tnf4"):
            assert c[m][0] == 1, (m, c)
        assert c["s32"] == (1, 0), c
        text = requests.get(srv.url + "/metrics", timeout=30).text
        for m in ("s8", "t16", "tnf4"):
            assert f'dolphin_model_loads_total{{model="{m}"}} 1' in text
        # no model is unloaded before the three requests it was loaded for ran
        served = {m: 0 for m in ("s8", "t16", "tnf4")}
        for line in srv.log().splitlines():
            for m in served:
                if f"route=/v1/completions model={m} status=200" in line:
                    served[m] += 1
                if f"event=model_unloaded model={m} " in line:
                    assert served[m] == 3, (m, served, line)
    finally:
        srv.stop()


def test_broken_entry_evicts_nothing(tmp_path):
    """With max_loaded_models reached by an idle healthy model, a request for
    an entry that is no model gets 503 with the reason, and the healthy
    model stays loaded (its unload counter does not move)."""
    broken = tmp_path / "not-a-model"
    broken.mkdir()
    (broken / "README").write_text("no config.json here\n")
    cfg = write_config(tmp_path, f"""
models:
  - name: good
    path: "{model_dir('stories260K')}"
  - name: broken
    path: "{broken}"
max_loaded_models: 1
""")
    srv = Dolphind(None, ["--config", cfg])
    try:
        assert complete(srv, "good", "Once", 2).status_code == 200
        before = counters(srv)["good"]
        err = check_error(complete(srv, "broken", "Once", 4), 503, code="model_unavailable")
        assert "config.json" in err["message"], err
        assert counters(srv)["good"] == before
        assert states(srv)["good"] == "loaded"
        text = requests.get(srv.url + "/metrics", timeout=30).text
        assert 'dolphin_model_unloads_total{model="good"} 0' in text
        assert complete(srv, "good", "Once", 2).status_code == 200
    finally:
        srv.stop()


def test_drain_serves_requests_waiting_for_a_load(tmp_path):
    """SIGTERM while a request waits for its model's load (for room: the
    other model runs a stream): the stream ends, the load goes on, the
    waiting request is served (it was accepted before the signal), and the
    load is no failure; dolphind exits 0."""
    import signal
    cfg = write_config(tmp_path, f"""
models:
  - name: a
    path: "{model_dir('tiny-llama2')}"
  - name: b
    path: "{model_dir('stories260K')}"
    weights: nf4
max_loaded_models: 1
drain_timeout_s: 120
""")
    srv = Dolphind(None, ["--config", cfg])
    out = {}
    try:
        body = {"model": "a", "prompt": "Once", "max_tokens": 400, "n": 4, "ignore_eos": True,
                "stream": True}
        with requests.post(srv.url + "/v1/completions", json=body, stream=True,
                           timeout=120) as long:
            assert long.status_code == 200
            t = threading.Thread(target=lambda: out.update(b=complete(srv, "b", "Once", 4)))
            t.start()
            deadline = time.monotonic() + 30
            while models(srv)["b"]["dolphin"]["state"] != "loading":
                assert time.monotonic() < deadline, "b never started loading"
                time.sleep(0.01)
            srv.proc.send_signal(signal.SIGTERM)
            events, done = parse_sse(long)
            assert done
        t.join(120)
        assert out["b"].status_code == 200, (out["b"].text, srv.log()[-3000:])
        assert srv.proc.wait(timeout=60) == 0
        log = srv.log()
        assert "event=model_load_failed" not in log, log
        assert "event=model_loaded" in log and "model=b" in log
    finally:
        srv.stop()
