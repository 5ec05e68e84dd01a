"""tests/cluster/load.py — steady load through nginx for the fault tests:
`concurrency` clients, each sending greedy (temperature 0) completions of
the stories260K golden cases, streamed or whole at random, one after the
other until told to stop. Every request is recorded with its start and end
time, its X-Request-Id and how it ended; a response is only "ok" when it is
complete and its text equals the golden greedy text.

Outcomes: ok, http_<status> (an error status), stream_cut (a 200 stream that
ended without [DONE]), wrong_text, conn_error (no response at all) and
client_timeout (nothing for CLIENT_TIMEOUT_S: a hang; never allowed)."""
import random
import threading
import time
from dataclasses import dataclass, field

import requests

from dolphin_server import SHARED, parse_sse, stream_texts

CLIENT_TIMEOUT_S = 30


def golden_cases():
    import json
    cases = json.loads((SHARED / "golden" / "stories260K.json").read_text())["cases"]
    return [(c["prompt"], c["max_tokens"], c["greedy_text"]) for c in cases]


@dataclass
class Result:
    rid: str
    stream: bool
    t0: float
    t1: float = 0.0
    outcome: str = ""
    status: int = 0
    retry_after: str = ""
    detail: str = ""

    @property
    def latency(self):
        return self.t1 - self.t0


@dataclass
class Load:
    url: str
    name: str
    concurrency: int = 16
    min_requests: int = 300
    max_requests: int = 20000
    seed: int = 1
    honor_retry_after: bool = False
    results: list = field(default_factory=list)

    def __post_init__(self):
        self.cases = golden_cases()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.n = 0
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                        for i in range(self.concurrency)]

    # ---- control ---------------------------------------------------------------
    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self, timeout=120):
        """Stop once min_requests were sent; wait for the clients."""
        deadline = time.monotonic() + timeout
        while self.sent() < self.min_requests and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stopping.set()
        for t in self.threads:
            t.join(max(1.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "a client still waits: a hang"
        return self.results

    def sent(self):
        with self.lock:
            return self.n

    def wait_sent(self, n, timeout=60):
        deadline = time.monotonic() + timeout
        while self.sent() < n:
            assert time.monotonic() < deadline, f"only {self.sent()} of {n} requests sent"
            time.sleep(0.01)

    # ---- one client ------------------------------------------------------------
    def _client(self, k):
        rng = random.Random(self.seed * 1000 + k)
        session = requests.Session()
        while not self.stopping.is_set():
            with self.lock:
                if self.n >= self.max_requests:
                    return
                i = self.n
                self.n += 1
            prompt, max_tokens, want = rng.choice(self.cases)
            res = Result(f"{self.name}-{i}", rng.random() < 0.5, time.monotonic())
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                    "stream": res.stream}
            try:
                self._one(session, body, want, res)
            except requests.Timeout as e:
                res.outcome, res.detail = "client_timeout", str(e)[:200]
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as e:
                # before a status line: no response; inside a stream: cut short
                res.outcome = "stream_cut" if res.status == 200 else "conn_error"
                res.detail = str(e)[:200]
                session = requests.Session()
            res.t1 = time.monotonic()
            with self.lock:
                self.results.append(res)
            if res.status == 429 and self.honor_retry_after:
                time.sleep(float(res.retry_after or 1))

    def _one(self, session, body, want, res):
        with session.post(self.url + "/v1/completions", json=body, stream=True,
                          timeout=CLIENT_TIMEOUT_S,
                          headers={"X-Request-Id": res.rid}) as r:
            res.status = r.status_code
            res.retry_after = r.headers.get("Retry-After", "")
            raw = b"".join(r.iter_content(chunk_size=None))
        if res.status != 200:
            res.outcome, res.detail = f"http_{res.status}", raw[:200].decode(errors="replace")
            return
        if res.stream:
            try:
                events, done = parse_sse(raw)
            except (AssertionError, ValueError) as e:
                res.outcome, res.detail = "stream_cut", str(e)[:200]
                return
            if not done:
                res.outcome = "stream_cut"
                return
            text = stream_texts(events)[0]
        else:
            import json
            text = json.loads(raw)["choices"][0]["text"]
        res.outcome = "ok" if text == want else "wrong_text"
        if text != want:
            res.detail = f"{text[:80]!r} != {want[:80]!r}"


def percentile(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def report(name, results, admitted_only=False):
    """Print one line of counts for the closing note; return the failures
    by kind. Latencies: of all requests, or of the admitted ones (not 429)."""
    kinds = {}
    for r in results:
        if r.outcome != "ok":
            kinds[r.outcome] = kinds.get(r.outcome, 0) + 1
    lat = [r.latency for r in results if not admitted_only or r.status != 429]
    ok = sum(1 for r in results if r.outcome == "ok")
    streams = sum(1 for r in results if r.stream)
    fails = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none"
    what = "admitted" if admitted_only else "all"
    print(f"\ncluster {name}: requests {len(results)} ({streams} streamed), ok {ok}, "
          f"failures: {fails}; latency of {what} p50 {percentile(lat, 50) * 1000:.0f} ms, "
          f"p99 {percentile(lat, 99) * 1000:.0f} ms", flush=True)
    return kinds
