"""Speculative decoding through the server (docs/speculative.md): with
speculative_mode ngram, and with draft (stories260K drafted by its own GGUF
file), every answer is the one without it (greedy and
sampled, whole and streamed, stop strings and max_tokens inside an accepted
run, logprobs, n > 1, structured output, usage); 2,000 sampled first tokens
agree with the plain server's in a chi-square test; a request can opt out;
/metrics and the request log line give proposed / accepted / acceptance;
the YAML mapping form, and bad settings exit 2 naming the key; a draft
model with another vocabulary, or none in models:, exits 2 at start.

The arithmetic on every fixture and GGUF file with max_draft 1..8, alone and
in a batch, is tests/unit/test_speculative.c."""
import re
import subprocess
import time

import pytest
import requests
from scipy.stats import chi2_contingency

from dolphin_server import BIN, Dolphind, check_error, gguf_file, model_dir, parse_sse

# max_batch_size 16: eight sequences fill the batch only halfway, so
# speculation stays on for n = 8
ARGS = ["--max-batch-size", "16"]
REPEATS = "The cat sat on the mat. The cat sat on the mat. The cat sat on the"


def _draft_config(path, target, draft, extra=""):
    """A models list: `target` (named target) drafted by `draft` (named draft)."""
    path.write_text(f"speculative: {{mode: draft, draft_model: draft{extra}}}\nmodels:\n"
                    f"  - {{name: target, path: '{target}'}}\n  - {{name: draft, path: '{draft}'}}\n")
    return path


@pytest.fixture(scope="module", params=["ngram", "draft"])
def pair(request, tmp_path_factory):
    if request.param == "ngram":
        spec = Dolphind("stories260K", [*ARGS, "--speculative-mode", "ngram", "--speculative-max-draft", "6"],
                        threads=1)
    else:
        cfg = _draft_config(tmp_path_factory.mktemp("draft") / "dolphin.yaml", model_dir("stories260K"),
                            gguf_file("stories260K-F32.gguf"), ", max_draft: 6")
        spec = Dolphind(None, [*ARGS, "--config", cfg], threads=1)
        spec.model = "target"
    plain = Dolphind("stories260K", ARGS, threads=1)
    yield spec, plain
    spec.stop()
    plain.stop()


def _strip(body):
    """A response without what differs between two servers by design."""
    body = dict(body)
    for k in ("id", "created", "system_fingerprint", "model"):
        body.pop(k, None)
    return body


def _both(pair, body, path="/v1/completions"):
    spec, plain = pair
    rs = spec.post(path, {"model": spec.model, **body})
    rp = plain.post(path, {"model": plain.model, **body})
    assert rs.status_code == 200, rs.text
    assert rp.status_code == 200, rp.text
    return rs, rp


def _spec_fields(d, request_id):
    """The spec_* fields of the request's log line (written as the answer
    ends: waited for up to 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        line = [ln for ln in d.log().splitlines() if "event=request " in ln and request_id in ln]
        if line or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert line, d.log()[-2000:]
    return dict(re.findall(r"(spec_\w+)=(\S+)", line[-1]))


@pytest.mark.parametrize("extra", [
    {"max_tokens": 64},
    {"max_tokens": 5},                        # ends inside an accepted run
    {"max_tokens": 64, "stop": ["mat"]},      # a stop string inside a run
    {"max_tokens": 64, "stop": [" sat on"]},
    {"max_tokens": 64, "logprobs": 5, "echo": True},
    {"max_tokens": 48, "n": 3, "temperature": 0.9, "seed": 42},
    {"max_tokens": 48, "temperature": 1.0, "top_k": 20, "seed": 7, "logprobs": 2},
])
def test_whole_answers_equal(pair, extra):
    body = {"prompt": REPEATS, "temperature": 0, "logprobs": 5, "return_token_ids": True, **extra}
    rs, rp = _both(pair, body)
    assert _strip(rs.json()) == _strip(rp.json())


def _spec_metrics(d):
    m = requests.get(d.url + "/metrics", timeout=30).text
    lab = re.escape(f'{{model="{d.model}"}}')
    return tuple(float(re.search(r"^dolphin_spec_" + k + lab + r" (\S+)$", m, re.M)[1])
                 for k in ("proposed_tokens_total", "accepted_tokens_total"))


def test_proposals_accepted_and_reported(pair):
    spec, _ = pair
    for max_tokens in (50, 23, 64):   # the last step's drafts capped by max_tokens
        before = _spec_metrics(spec)
        rs, rp = _both(pair, {"prompt": REPEATS, "max_tokens": max_tokens, "temperature": 0})
        after = _spec_metrics(spec)
        assert _strip(rs.json()) == _strip(rp.json())
        f = _spec_fields(spec, rs.headers["X-Request-Id"])
        # the log line counts every draft of the request, the last step's too
        assert (int(f["spec_proposed"]), int(f["spec_accepted"])) == (after[0] - before[0], after[1] - before[1])
    proposed, accepted = int(f["spec_proposed"]), int(f["spec_accepted"])
    assert 0 < accepted <= proposed
    assert float(f["spec_acceptance"]) == pytest.approx(accepted / proposed, abs=1e-3)
    m = requests.get(spec.url + "/metrics", timeout=30).text
    lab = f'{{model="{spec.model}"}}'
    prop = float(re.search(r"^dolphin_spec_proposed_tokens_total" + re.escape(lab) + r" (\S+)$", m, re.M)[1])
    acc = float(re.search(r"^dolphin_spec_accepted_tokens_total" + re.escape(lab) + r" (\S+)$", m, re.M)[1])
    ratio = float(re.search(r"^dolphin_spec_acceptance_ratio" + re.escape(lab) + r" (\S+)$", m, re.M)[1])
    assert prop >= proposed and acc >= accepted and ratio == pytest.approx(acc / prop)
    assert "# TYPE dolphin_spec_proposed_tokens_total counter" in m


def test_streamed_equal(pair):
    body = {"prompt": REPEATS, "max_tokens": 64, "temperature": 0, "logprobs": 1, "stream": True,
            "stream_options": {"include_usage": True}}
    spec, plain = pair
    rs = spec.post("/v1/completions", {"model": spec.model, **body}, stream=True)
    rp = plain.post("/v1/completions", {"model": plain.model, **body}, stream=True)
    es, done_s = parse_sse(rs)
    ep, done_p = parse_sse(rp)
    assert done_s and done_p

    def pieces(events):
        text, lps, usage, finish = "", [], None, None
        for ev in events:
            usage = ev.get("usage") or usage
            for ch in ev.get("choices", []):
                text += ch["text"]
                if ch.get("logprobs"):
                    lps += list(zip(ch["logprobs"]["tokens"], ch["logprobs"]["token_logprobs"]))
                finish = ch.get("finish_reason") or finish
        return text, lps, usage, finish

    assert pieces(es) == pieces(ep)
    # several tokens in one step arrive in order, as one or more chunks
    assert pieces(es)[0] == "".join(t for t, _ in pieces(es)[1])


def test_chat_and_structured_output_equal(pair):
    body = {"messages": [{"role": "user", "content": REPEATS}], "max_tokens": 48, "temperature": 0,
            "logprobs": True, "top_logprobs": 3}
    rs, rp = _both(pair, body, "/v1/chat/completions")
    assert _strip(rs.json()) == _strip(rp.json())
    body["response_format"] = {"type": "json_object"}
    rs, rp = _both(pair, body, "/v1/chat/completions")
    assert _strip(rs.json()) == _strip(rp.json())


def test_sampled_first_tokens_chi_square(pair):
    """2,000 samples of the first three tokens (250 requests of n = 8, each
    with its own seed) from each server: the frequencies per position are
    one distribution (chi-square test of homogeneity, p >= 0.01)."""
    spec, plain = pair
    counts = {0: {}, 1: {}}
    for side, d in enumerate((spec, plain)):
        for seed in range(250):
            r = d.complete({"model": d.model, "prompt": "Once upon a time", "max_tokens": 3, "n": 8,
                            "temperature": 1.0, "seed": 1000 + 8 * seed, "return_token_ids": True})
            assert r.status_code == 200, r.text
            for ch in r.json()["choices"]:
                for pos, tid in enumerate(ch["token_ids"][:3]):
                    counts[side].setdefault(pos, []).append(tid)
    for pos in range(3):
        a, b = counts[0].get(pos, []), counts[1].get(pos, [])
        assert len(a) > 1500 and len(b) > 1500
        ids = sorted(set(a) | set(b))
        table = [[a.count(i) for i in ids], [b.count(i) for i in ids]]
        # ids seen fewer than 10 times in all go to one column, so that no
        # expected count is tiny
        keep = [j for j in range(len(ids)) if table[0][j] + table[1][j] >= 10]
        rest = [j for j in range(len(ids)) if j not in keep]
        rows = [[row[j] for j in keep] + [sum(row[j] for j in rest)] for row in table]
        if sum(rows[0][-1:] + rows[1][-1:]) == 0:
            rows = [row[:-1] for row in rows]
        if len(rows[0]) < 2:
            continue
        p = chi2_contingency(rows)[1]
        assert p >= 0.01, (pos, p, rows)


def test_opt_out_and_bad_field(pair):
    spec, plain = pair
    body = {"prompt": REPEATS, "max_tokens": 48, "temperature": 0}
    r = spec.complete({"model": spec.model, **body, "speculative": False})
    assert r.status_code == 200, r.text
    assert _spec_fields(spec, r.headers["X-Request-Id"]) == {}
    assert _strip(r.json()) == _strip(plain.complete({"model": plain.model, **body}).json())
    r = spec.complete({"model": spec.model, **body, "speculative": "no"})
    check_error(r, 400, param="speculative")
    # the field is accepted (and changes nothing) where speculation is off
    r = plain.complete({"model": plain.model, **body, "speculative": True})
    assert r.status_code == 200, r.text


def _exit(args):
    return subprocess.run([str(BIN), "--port", "0", "--threads", "1", *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def test_yaml_mapping(tmp_path):
    cfg = tmp_path / "dolphin.yaml"
    cfg.write_text(f"model: {model_dir('stories260K')}\nspeculative:\n  mode: ngram\n  max_draft: 3\n"
                   "  ngram: 2\n  min_acceptance: 0.1\n")
    d = Dolphind(None, ["--config", cfg], threads=1)
    try:
        r = d.complete({"model": "stories260K", "prompt": REPEATS, "max_tokens": 32, "temperature": 0})
        assert r.status_code == 200, r.text
        assert int(_spec_fields(d, r.headers["X-Request-Id"])["spec_proposed"]) > 0
    finally:
        d.stop()


@pytest.mark.parametrize("yaml_text,flags,want", [
    ("speculative:\n  mode: medusa\n", [], "speculative.mode"),
    ("speculative:\n  max_drafts: 3\n", [], "speculative.max_drafts: unknown key"),
    ("speculative:\n  max_draft: 40\n", [], "speculative.max_draft"),
    ("speculative:\n  mode: [ngram]\n", [], "speculative.mode"),
    ("speculative:\n  mode: ngram\nspeculative_mode: off\n", [], "set twice"),
    ("", ["--speculative-max-draft", "0"], "--speculative-max-draft"),
    ("", ["--speculative-min-acceptance", "1.5"], "--speculative-min-acceptance"),
])
def test_bad_settings_exit_2(tmp_path, yaml_text, flags, want):
    cfg = tmp_path / "dolphin.yaml"
    cfg.write_text(f"model: {model_dir('stories260K')}\n{yaml_text}")
    p = _exit(["--config", cfg, *flags])
    assert p.returncode == 2, p.stderr
    assert want in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_draft_with_another_vocabulary_refused(tmp_path):
    """tiny-llama2 (32,000 pieces) cannot draft for stories260K (512), nor
    the other way round: the start fails with exit 2, one line naming both
    models, also when the model is not one loaded at start."""
    cfg = _draft_config(tmp_path / "dolphin.yaml", model_dir("stories260K"), model_dir("tiny-llama2"))
    later = tmp_path / "later.yaml"
    later.write_text(f"models:\n  - {{name: first, path: '{model_dir('stories260K')}'}}\n"
                     f"  - name: target\n    path: '{model_dir('tiny-llama2')}'\n"
                     "    speculative: {mode: draft, draft_model: first}\n")
    for c, draft in ((cfg, "'draft'"), (later, "'first'")):
        p = _exit(["--config", c])
        assert p.returncode == 2, p.stderr
        last = p.stderr.strip().splitlines()[-1]
        assert "'target'" in last and draft in last and "vocabulary" in last, p.stderr


@pytest.mark.parametrize("yaml_text,want", [
    ("speculative: {mode: draft}\nmodel: {m}\n", "speculative.draft_model: missing"),
    ("speculative: {mode: draft, draft_model: nope}\nmodel: {m}\n", "'nope' is no entry of models"),
    ("models:\n  - {name: a, path: {m}, speculative: {mode: draft, draft_model: a}}\n",
     "models[0] 'a'.speculative.draft_model: 'a' is this model itself"),
    ("models:\n  - {name: a, path: {m}, speculative: {mode: draft, draft: b}}\n",
     "models[0] 'a'.speculative.draft: unknown key"),
    ("models:\n  - {name: a, path: {m}, speculative: draft}\n", "models[0] 'a'.speculative: expected a mapping"),
    ("speculative: draft\nmodel: {m}\n", "field speculative: expected a mapping"),
    ("speculative: {mode: off, draft_model: nope}\nmodel: {m}\n", "'nope' is no entry of models"),
])
def test_bad_draft_settings_exit_2(tmp_path, yaml_text, want):
    cfg = tmp_path / "dolphin.yaml"
    cfg.write_text(yaml_text.replace("{m}", f"'{model_dir('stories260K')}'"))
    p = _exit(["--config", cfg])
    assert p.returncode == 2, p.stderr
    assert want in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_one_sequence_speculates_at_max_batch_size_1(tmp_path):
    """A batch of one is full, but nobody else needs the compute: the one
    decoding sequence proposes, and the answer is the plain one."""
    body = {"prompt": REPEATS, "max_tokens": 48, "temperature": 0}
    d = Dolphind("stories260K", ["--max-batch-size", "1", "--speculative-mode", "ngram"], threads=1)
    plain = Dolphind("stories260K", ["--max-batch-size", "1"], threads=1)
    try:
        r = d.complete({"model": d.model, **body})
        assert r.status_code == 200, r.text
        assert int(_spec_fields(d, r.headers["X-Request-Id"])["spec_proposed"]) > 0
        assert _strip(r.json()) == _strip(plain.complete({"model": plain.model, **body}).json())
    finally:
        d.stop()
        plain.stop()


def test_draft_set_per_model_and_not_for_itself(tmp_path):
    """A top-level draft setting applies to every other entry, not to the
    draft itself; the draft entry still serves requests of its own."""
    cfg = _draft_config(tmp_path / "dolphin.yaml", model_dir("stories260K"), gguf_file("stories260K-F32.gguf"))
    d = Dolphind(None, ["--config", cfg], threads=1)
    try:
        for name, spec in (("target", True), ("draft", False)):
            r = d.complete({"model": name, "prompt": REPEATS, "max_tokens": 32, "temperature": 0})
            assert r.status_code == 200, r.text
            f = _spec_fields(d, r.headers["X-Request-Id"])
            assert (int(f.get("spec_proposed", 0)) > 0) == spec, (name, f)
        assert "event=draft_model_loaded model=target draft_model=draft" in d.log()
    finally:
        d.stop()
