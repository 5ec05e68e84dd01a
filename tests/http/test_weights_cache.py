"""The CPU prepared-weights cache seen from outside (weights_cache_dir,
docs/configuration.md): dolphind started twice on the same folder logs a
miss, then a hit, and answers the greedy goldens the same both times; the
key also works per models: entry of a config file."""
import os
import re
import shutil
import tempfile

import pytest

from dolphin_server import Dolphind, model_dir


@pytest.fixture
def cache_dir():
    d = tempfile.mkdtemp(prefix="dolphin-wcache-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def cache_result(log):
    found = re.findall(r"event=weights_cache result=(\w+) ", log)
    assert len(found) == 1, log[-4000:]
    return found[0]


def greedy(srv, golden):
    texts = []
    for case in golden["cases"]:
        r = srv.complete({"prompt": case["prompt"], "max_tokens": case["max_tokens"],
                          "temperature": 0})
        assert r.status_code == 200, r.text
        texts.append(r.json()["choices"][0]["text"])
    return texts


def test_miss_then_hit_same_golden(cache_dir, stories_golden):
    want = [c["greedy_text"] for c in stories_golden["cases"]]
    results = []
    for _ in range(2):
        srv = Dolphind("stories260K", ["--weights-cache-dir", cache_dir])
        try:
            results.append(cache_result(srv.log()))
            assert greedy(srv, stories_golden) == want   # F32: the goldens exactly
        finally:
            srv.stop()
    assert results == ["miss", "hit"]
    assert len([f for f in os.listdir(cache_dir) if f.endswith(".dwc")]) == 1


def test_nf4_hit_answers_as_converted(cache_dir, tiny_golden):
    runs = []
    for _ in range(2):
        srv = Dolphind("tiny-llama2", ["--weights", "nf4", "--weights-cache-dir", cache_dir])
        try:
            runs.append((cache_result(srv.log()), greedy(srv, tiny_golden)))
        finally:
            srv.stop()
    assert [r for r, _ in runs] == ["miss", "hit"]
    assert runs[0][1] == runs[1][1]


def test_per_model_entry(cache_dir, tmp_path):
    cfg = tmp_path / "dolphin.yaml"
    cfg.write_text(f"models:\n  - name: s\n    path: \"{model_dir('stories260K')}\"\n"
                   f"    pinned: true\n    weights_cache_dir: \"{cache_dir}\"\n")
    results = []
    for _ in range(2):
        srv = Dolphind(None, ["--config", str(cfg)])
        try:
            results.append(cache_result(srv.log()))
        finally:
            srv.stop()
    assert results == ["miss", "hit"]
