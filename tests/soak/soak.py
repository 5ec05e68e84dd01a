#!/usr/bin/env python3
"""tests/soak/soak.py — a bounded soak test of dolphind, on the test harness
of tests/http/dolphin_server.py (run it with the .venv's python).

Starts dolphind on 127.0.0.1 with the stories260K test model and sends a
shuffled mix of requests at a fixed concurrency: valid non-streaming ones
(greedy, so each must return exactly the text the same request returned when
sent alone first), streaming ones (the streamed pieces must concatenate to
that same text), streams cancelled by closing the socket after the first
chunk, malformed bodies (4xx with an OpenAI-shaped error) and bodies larger
than max_body_bytes (413). Then it checks that every valid request was
answered correctly, the server never crashed, every KV-cache block went back
to the pool (/healthz kv_cache.blocks_used == 0) and resident memory (VmRSS)
(and its anonymous part, RssAnon) grew less than 5 % (--max-rss-growth; CI: 3 %
over 20,000 requests) between the end of a warm-up phase and the end of the
run. RssAnon must also grow by more than 1 MiB (its noise) to fail, and either
by more than --min-rss-growth-mib (default 0; the --models run allows 4 MiB:
loads and unloads move the heap). Both are printed every --step requests, to
tell a steady climb (a leak) from noise. Only growth is judged: a drop of
VmRSS is the kernel reclaiming file-backed pages (the mapped model, the
binary) under memory pressure, which says nothing about dolphind. Prints a summary; exits 1 on any failure, 0 when all holds (also when
the fixtures are absent: it says it skipped).

    .venv/bin/python tests/soak/soak.py [--bin build/dolphind] [--requests 2000]
                               [--warmup 300] [--concurrency 16] [--step 2000]
                               [--max-rss-growth 5] [--min-rss-growth-mib 0]
                               [--no-rss-check] [--models]

With --models the server serves three models (stories260K F32, tiny-llama2
F16, stories260K NF4 under another name) with at most two loaded, and every
request picks one at random: loads and unloads go on under the load, and the
references are taken per model. Memory is compared with the same two models
loaded at both points.

With a sanitizer build (--no-rss-check: ASan's quarantine keeps freed memory
resident) the same run checks for memory errors and leaks under load: any
sanitizer report in dolphind's log fails it.

Environment: DOLPHIN_BIN (default <repo>/build/dolphind), DOLPHIN_SHARED
(default <repo>/../shared).
"""
import argparse
import json
import os
import random
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "http"))
from dolphin_server import Dolphind, check_error_parts, parse_sse, stream_texts  # noqa: E402
MAX_BODY = 1 << 20        # dolphind's default max_body_bytes
HTTP_TIMEOUT = 120        # seconds, per request

# Valid requests, all greedy. Each is sent alone first for its reference text.
VALID = [
    {"prompt": "Once upon a time", "max_tokens": 24},
    {"prompt": "The little dog", "max_tokens": 16},
    {"prompt": "Lily and Ben went to the park", "max_tokens": 40},
    {"prompt": "", "max_tokens": 12},
    {"prompt": "One day, a big bear", "max_tokens": 32},
    {"prompt": "Tom had a red ball.", "max_tokens": 8},
    {"prompt": "The sun was", "max_tokens": 48},
    {"prompt": [1, 403, 407, 261, 378], "max_tokens": 20},
    {"prompt": "Once upon a time", "max_tokens": 40, "stop": [" she", "."]},
    {"prompt": "She wanted to", "max_tokens": 12, "n": 2},
    {"prompt": ["A cat", "A bird sat"], "max_tokens": 10},
    {"prompt": "The end", "max_tokens": 16, "logprobs": 2},
]
for v in VALID:
    v["temperature"] = 0

# Malformed requests: (body bytes, content type, expected status).
MALFORMED = [
    (b'{"prompt": "x", "max_tokens": 5', "application/json", 400),
    (b"not json at all", "application/json", 400),
    (b"", "application/json", 400),
    (b"[1, 2, 3]", "application/json", 400),
    (b'{"prompt": 12}', "application/json", 400),
    (b'{"prompt": "x", "max_tokens": "many"}', "application/json", 400),
    (b'{"prompt": "x", "temperature": -1}', "application/json", 400),
    (b'{"prompt": "x", "n": 1000}', "application/json", 400),
    (b'{"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}', "application/json", 400),
    (b'{"prompt": "x", "max_tokens": 100000}', "application/json", 400),
    (b'{"prompt": "x", "stream": true, "logprobs": 9}', "application/json", 400),
    (b'{"prompt": "\xff\xfe"}', "application/json", 400),
    (b'{"prompt": "a\\u0000b"}', "application/json", 400),
    (b'{"prompt": "x"} {"prompt": "y"}', "application/json", 400),
    (b"[" * 5000 + b"]" * 5000, "application/json", 400),
    (b'{"prompt": "x"}', "text/plain", 415),
]

KINDS = ["valid", "stream", "cancel", "malformed", "oversize"]
WEIGHTS = [9, 5, 2, 2, 2]   # per 20 requests


class Failure(Exception):
    pass


ANON_SLACK_KIB = 1024     # RssAnon growth always allowed (noise; see the check)

# --models: the entries (name, test model, weights); two at most loaded
MODELS = [("stories", "stories260K", "f32"), ("tiny", "tiny-llama2", "f16"),
          ("stories-nf4", "stories260K", "nf4")]


def models_config(shared, path):
    lines = ["models:"]
    for name, model, weights in MODELS:
        lines += [f"  - name: {name}", f'    path: "{Path(shared) / "models" / model}"',
                  f"    weights: {weights}"]
    lines.append("max_loaded_models: 2")
    Path(path).write_text("\n".join(lines) + "\n")


def with_model(spec, model):
    return dict(spec, model=model) if model else spec


def post(srv, body, ctype="application/json"):
    """One POST /v1/completions of raw bytes, on a connection of its own."""
    return requests.post(srv.url + "/v1/completions", data=body,
                         headers={"Content-Type": ctype}, timeout=HTTP_TIMEOUT)


# ---- one request of each kind ------------------------------------------------

def texts_of(r):
    choices = sorted(r.json()["choices"], key=lambda c: c["index"])
    return [c["text"] for c in choices]


def do_valid(srv, spec, ref):
    r = post(srv, json.dumps(spec).encode())
    if r.status_code != 200:
        raise Failure(f"status {r.status_code}: {r.text[:200]!r}")
    got = texts_of(r)
    if got != ref:
        raise Failure(f"text {got!r} differs from the request alone: {ref!r}")


def do_stream(srv, spec, ref):
    r = post(srv, json.dumps(dict(spec, stream=True)).encode())
    if r.status_code != 200:
        raise Failure(f"status {r.status_code}: {r.text[:200]!r}")
    if not r.headers.get("Content-Type", "").startswith("text/event-stream"):
        raise Failure(f"stream Content-Type {r.headers.get('Content-Type')!r}")
    events, done = parse_sse(r.content)
    if not done:
        raise Failure(f"stream does not end with [DONE]: {r.text[-200:]!r}")
    errors = [ev for ev in events if "error" in ev]
    if errors:
        raise Failure(f"error event {errors[0]}")
    out = stream_texts(events, len(ref))
    if out != ref:
        raise Failure(f"streamed {out!r} differs from the non-streamed text {ref!r}")


def do_cancel(srv, model=None):
    body = json.dumps(with_model({"prompt": "Once upon a time", "max_tokens": 400,
                                  "ignore_eos": True, "temperature": 0, "stream": True},
                                 model)).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=HTTP_TIMEOUT)
    try:
        s.sendall(head + body)
        buf = b""
        while b"data: " not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise Failure(f"connection closed before the first chunk: {buf[:200]!r}")
            buf += chunk
        if not buf.startswith(b"HTTP/1.1 200"):
            raise Failure(f"stream answered {buf[:100]!r}")
    finally:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def do_malformed(srv, case):
    body, ctype, want = case
    r = post(srv, body, ctype)
    check_error_parts(r.status_code, r.headers, r.text, want)


def do_oversize(srv, extra):
    pad = MAX_BODY + 1 + extra
    body = b'{"prompt": "' + b"a" * pad + b'"}'
    r = post(srv, body)
    check_error_parts(r.status_code, r.headers, r.text, 413)


# ---- the run -----------------------------------------------------------------

class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.sent = {k: 0 for k in KINDS}
        self.failed = {k: 0 for k in KINDS}
        self.examples = []

    def add(self, kind, err):
        with self.lock:
            self.sent[kind] += 1
            if err is not None:
                self.failed[kind] += 1
                if len(self.examples) < 10:
                    self.examples.append(f"{kind}: {err}")


def run_phase(srv, plan, refs, concurrency, tally, deadline):
    def one(item):
        kind, arg = item
        if time.monotonic() > deadline:
            tally.add(kind, "not sent: the soak test ran out of time")
            return
        try:
            if kind in ("valid", "stream"):
                i, model = arg
                spec, ref = with_model(VALID[i], model), refs[(i, model)]
                (do_valid if kind == "valid" else do_stream)(srv, spec, ref)
            elif kind == "cancel":
                do_cancel(srv, arg)
            elif kind == "malformed":
                do_malformed(srv, MALFORMED[arg])
            else:
                do_oversize(srv, arg)
            tally.add(kind, None)
        except Exception as e:  # noqa: BLE001 — every failure is counted
            tally.add(kind, f"{type(e).__name__}: {e}"[:400])
    with ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(one, plan))


def make_plan(n, rng, models):
    plan = []
    for _ in range(n):
        kind = rng.choices(KINDS, WEIGHTS)[0]
        arg = {"valid": lambda: (rng.randrange(len(VALID)), rng.choice(models)),
               "stream": lambda: (rng.randrange(len(VALID)), rng.choice(models)),
               "cancel": lambda: rng.choice(models),
               "malformed": lambda: rng.randrange(len(MALFORMED)),
               "oversize": lambda: rng.randrange(0, 4096)}[kind]()
        plan.append((kind, arg))
    return plan


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.environ.get("DOLPHIN_BIN", REPO / "build" / "dolphind"))
    ap.add_argument("--shared", default=os.environ.get("DOLPHIN_SHARED", REPO.parent / "shared"))
    ap.add_argument("--requests", type=int, default=2000, help="total, warm-up included")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2, help="dolphind compute threads")
    ap.add_argument("--backend", default="cpu",
                    help="dolphind --backend (cpu: F32, so batching never changes a greedy "
                         "result; with FP16 on a GPU it may)")
    ap.add_argument("--max-rss-growth", type=float, default=5.0, help="percent")
    ap.add_argument("--step", type=int, default=2000,
                    help="sample RSS after every this many requests past the warm-up")
    ap.add_argument("--min-rss-growth-mib", type=float, default=0.0,
                    help="growth below this many MiB is never judged a leak (dolphind maps its "
                         "large buffers, so its resident base can be a few MiB, where malloc's "
                         "own bookkeeping moves by more than 5 %%)")
    ap.add_argument("--no-rss-check", action="store_true",
                    help="report memory but do not judge it (sanitizer builds, whose "
                         "quarantine keeps freed memory resident)")
    ap.add_argument("--time-limit", type=float, default=300, help="seconds for the whole run")
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--models", action="store_true",
                    help="three models, two loaded at most, requests spread over them")
    a = ap.parse_args()
    names = [m[0] for m in MODELS] if a.models else [None]

    model = Path(a.shared) / "models" / "stories260K"
    if not model.is_dir():
        print(f"soak: skipped: test model {model} not found (set DOLPHIN_SHARED)")
        return 0
    if not Path(a.bin).is_file():
        print(f"soak: FAILED: {a.bin} not built")
        return 1

    t0 = time.monotonic()
    deadline = t0 + a.time_limit
    rng = random.Random(a.seed)
    problems = []
    try:
        if a.models:
            cfg = Path(tempfile.mkdtemp(prefix="soak-")) / "models.yaml"
            models_config(a.shared, cfg)
            srv = Dolphind(None, ["--config", cfg, "--backend", a.backend, "--log-level", "warn"],
                           threads=a.threads, binary=a.bin)
        else:
            srv = Dolphind(model, ["--backend", a.backend, "--log-level", "warn"],
                           threads=a.threads, binary=a.bin)
    except BaseException as e:  # noqa: BLE001 — the harness fails through pytest.fail
        print(f"soak: FAILED: {e}")
        return 1
    try:
        # 1. references: each valid request alone (on each model)
        refs = {}
        for model in names:
            for i, spec in enumerate(VALID):
                r = post(srv, json.dumps(with_model(spec, model)).encode())
                if r.status_code != 200:
                    raise Failure(f"reference request {spec} ({model}) answered "
                                  f"{r.status_code}: {r.text[:200]!r}")
                refs[(i, model)] = texts_of(r)

        def settle():
            """Idle, with the same models loaded every time (the least
            recently used goes first: tiny, then the two stories ones)."""
            if a.models:
                for m in ("tiny", "stories", "stories-nf4"):
                    r = post(srv, json.dumps({"model": m, "prompt": "x", "max_tokens": 1}).encode())
                    if r.status_code != 200:
                        raise Failure(f"{m} answered {r.status_code}: {r.text[:200]!r}")
            return srv.wait_idle()

        # 2. warm-up, 3. the rest; RSS after each, once idle
        tally = Tally()
        run_phase(srv, make_plan(a.warmup, rng, names), refs, a.concurrency, tally, deadline)
        settle()
        rss_warm = srv.rss_kib()
        t_warm = time.monotonic()
        # the rest in steps of --step requests, RSS sampled (idle) after each,
        # to tell a steady climb (a leak) from a step at the start
        trail = [rss_warm]
        left = a.requests - a.warmup
        while left > 0:
            n = min(a.step, left)
            run_phase(srv, make_plan(n, rng, names), refs, a.concurrency, tally, deadline)
            left -= n
            if left > 0 and srv.proc.poll() is None:
                settle()
                trail.append(srv.rss_kib())
        if srv.proc.poll() is not None:
            raise Failure(f"dolphind died (exit {srv.proc.returncode}):\n{srv.log()[-3000:]}")
        h = settle()
        rss_end = srv.rss_kib()
        trail.append(rss_end)
        print("soak: VmRSS / RssAnon (MiB) after warm-up, then every "
              f"{a.step} requests: " + " ".join(f"{v / 1024:.2f}/{an / 1024:.2f}"
                                                 for v, an in trail))
        t_end = time.monotonic()
        status = requests.get(srv.url + "/healthz", timeout=30).status_code
        if status != 200:
            problems.append(f"/healthz answers {status} after the load")
        growth = 100.0 * (rss_end[0] - rss_warm[0]) / rss_warm[0]
        anon_growth = 100.0 * (rss_end[1] - rss_warm[1]) / rss_warm[1]

        total = sum(tally.sent.values())
        errors = sum(tally.failed.values())
        counts = ", ".join(f"{k} {tally.sent[k]}" for k in KINDS)
        print(f"soak: {total} requests at concurrency {a.concurrency} ({counts}) "
              f"in {t_end - t0:.1f} s ({(total - a.warmup) / (t_end - t_warm):.1f} req/s "
              f"after warm-up)")
        print(f"soak: failures {errors}"
              + (" (" + ", ".join(f"{k} {v}" for k, v in tally.failed.items() if v) + ")"
                 if errors else ""))
        for ex in tally.examples:
            print(f"  {ex}")
        print(f"soak: KV blocks in use after the load {h['kv_cache']['blocks_used']} of "
              f"{h['kv_cache']['blocks_total']}")
        if a.models:
            ms = requests.get(srv.url + "/v1/models", timeout=30).json()["data"]
            print("soak: models " + ", ".join(
                f"{m['id']} {m['dolphin']['state']} loads {m['dolphin']['loads']} unloads "
                f"{m['dolphin']['unloads']} failures {m['dolphin']['load_failures']}" for m in ms))
            if any(m["dolphin"]["load_failures"] for m in ms):
                problems.append("a model failed to load")
        print(f"soak: VmRSS after warm-up {rss_warm[0] / 1024:.1f} MiB, at the end "
              f"{rss_end[0] / 1024:.1f} MiB ({growth:+.2f} %); RssAnon "
              f"{rss_warm[1] / 1024:.1f} -> {rss_end[1] / 1024:.1f} MiB ({anon_growth:+.2f} %); "
              + ("not judged" if a.no_rss_check else
                 f"limit {a.max_rss_growth:g} % and {a.min_rss_growth_mib:g} MiB each "
                 f"(RssAnon: and {ANON_SLACK_KIB // 1024} MiB)"))
        if errors:
            problems.append(f"{errors} requests failed")
        if total < a.requests:
            problems.append(f"only {total} of {a.requests} requests were sent")
        if not a.no_rss_check:
            grew = (rss_end[0] - rss_warm[0]) / 1024, (rss_end[1] - rss_warm[1]) / 1024
            if growth >= a.max_rss_growth and grew[0] >= a.min_rss_growth_mib:
                problems.append(f"resident memory (VmRSS) grew {growth:.2f} % after warm-up")
            # RssAnon is ~8 MiB here and malloc's heap top alone moves it by
            # up to ~0.4 MiB between idle samples (see the printed trail), so
            # it fails only past the percentage and 1 MiB both
            if (anon_growth >= a.max_rss_growth and grew[1] >= a.min_rss_growth_mib
                    and rss_end[1] - rss_warm[1] > ANON_SLACK_KIB):
                problems.append(f"anonymous memory (RssAnon) grew {anon_growth:.2f} % "
                                "after warm-up")
    except (Failure, AssertionError, OSError, ValueError, KeyError) as e:
        # OSError: the server stopped answering; ValueError/KeyError: bad /healthz;
        # AssertionError: not idle after the load
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        try:
            srv.stop()   # exit 0 and no sanitizer report in its log, or it raises
        except BaseException as e:  # noqa: BLE001
            problems.append(str(e)[:6000])
    if problems:
        for p in problems:
            print(f"soak: FAILED: {p}")
        return 1
    print(f"soak: passed in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
