#!/usr/bin/env python3
"""serve_check.py — step 6 of the GPU kit's run.sh: dolphind --backend cuda on
one model directory. Starts it once on a free loopback port and measures the
time from the start to /healthz answering 200, sends one completion and one
chat completion (each must answer 200 with text), then runs closed-loop
streaming clients at each --concurrency with the load generator of
scripts/bench-server (carried beside this file as bench-server): tokens/s,
TTFT and TPOT p50/p99. Writes everything to --json; exits 1 when any part
failed. Python 3 standard library only."""
import argparse
import importlib.machinery
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load_bench_server():
    path = str(HERE / "bench-server")
    loader = importlib.machinery.SourceFileLoader("bench_server", path)
    spec = importlib.util.spec_from_loader("bench_server", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def post(port, path, body, timeout):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", default="8,32")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    bs = load_bench_server()
    concs = [int(x) for x in args.concurrency.split(",") if x]
    port = bs.free_port()
    fd, log_path = tempfile.mkstemp(prefix="gpu-kit-dolphind-", suffix=".log")
    cmd = [args.bin, "--model", args.model, "--backend", "cuda", "--host", "127.0.0.1",
           "--port", str(port), "--max-batch-size", str(max(concs)), "--log-level", "info"]
    print("serve_check: " + " ".join(cmd), flush=True)
    res = {"ready_s": None, "completion": "FAIL", "chat": "FAIL", "rows": {}}
    ok = True
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=fd, stderr=fd, stdin=subprocess.DEVNULL)
    os.close(fd)
    srv = types.SimpleNamespace(port=port)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"dolphind exited with {proc.returncode} during start-up")
            if bs.Server.healthy(srv):
                res["ready_s"] = time.monotonic() - t0
                break
            if time.monotonic() - t0 > args.start_timeout:
                raise RuntimeError(f"dolphind not ready within {args.start_timeout} s")
            time.sleep(0.1)
        print(f"serve_check: ready in {res['ready_s']:.2f} s", flush=True)
        st, body = post(port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 16,
                                                  "temperature": 0}, 120)
        text = json.loads(body)["choices"][0]["text"] if st == 200 else ""
        res["completion"] = f"HTTP {st}, {len(text)} characters" if st == 200 and text else f"FAIL: HTTP {st} {body[:200]}"
        st, body = post(port, "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16,
                         "temperature": 0}, 120)
        text = json.loads(body)["choices"][0]["message"]["content"] if st == 200 else ""
        res["chat"] = f"HTTP {st}, {len(text)} characters" if st == 200 and text else f"FAIL: HTTP {st} {body[:200]}"
        print(f"serve_check: completion {res['completion']}; chat {res['chat']}", flush=True)
        ok = not res["completion"].startswith("FAIL") and not res["chat"].startswith("FAIL")
        load = types.SimpleNamespace(requests_per_client=args.requests_per_client,
                                     max_tokens=args.max_tokens, max_tokens_spread=0.0,
                                     request_timeout=300)
        for c in concs:
            r = bs.run_row(port, c, load, time.monotonic() + 600, proc.pid)
            res["rows"][str(c)] = r
            print(f"serve_check: {c} streams: {r['tok_per_s']:.1f} tokens/s, TTFT p50/p99 "
                  f"{r['ttft_p50']:.0f}/{r['ttft_p99']:.0f} ms, TPOT p50/p99 {r['tpot_p50']:.1f}/"
                  f"{r['tpot_p99']:.1f} ms, {r['errors']} of {r['requests']} failed", flush=True)
            ok = ok and r["errors"] == 0 and r["requests"] > 0
    except Exception as e:  # recorded, never raised past the summary
        print(f"serve_check: FAIL: {type(e).__name__}: {e}", flush=True)
        ok = False
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        tail = Path(log_path).read_text(errors="replace")[-6000:]
        os.unlink(log_path)
        print("---- dolphind log (end) ----\n" + tail, flush=True)
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
