"""Every ```sh block with curl in docs/api.md, run against a live server (the
base URL http://localhost:8080 replaced by the test server's; the server is
tiny-llama2 under the documented name llama-2-7b-chat). Each must succeed
with a 2xx and a well-formed body for its Content-Type: JSON, an SSE stream
of JSON events ending in [DONE], or Prometheus text. Also checks that every
endpoint has an example."""
import json
import re
import subprocess

import pytest

from dolphin_server import REPO, Dolphind

DOC = REPO / "docs" / "api.md"
DOC_BASE = "http://localhost:8080"
ENDPOINTS = ["/v1/models", "/v1/models/", "/v1/completions", "/v1/chat/completions",
             "/tokenize", "/detokenize", "/healthz", "/livez", "/metrics"]

# curl as the examples call it, plus the status and content type after the body
CURL_WRAPPER = ("curl() { command curl -sS --max-time 120 "
                "-w '\\n@@STATUS %{http_code} %{content_type}' \"$@\"; }\n")


def examples():
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S)
    return [b for b in blocks if "curl " in b]


@pytest.fixture(scope="module")
def docs_server():
    srv = Dolphind("tiny-llama2", ["--served-model-name", "llama-2-7b-chat"])
    yield srv
    srv.stop()


def test_every_endpoint_has_an_example():
    cmds = examples()
    assert cmds, "no curl examples in docs/api.md"
    for ep in ENDPOINTS:
        assert any(DOC_BASE + ep in c for c in cmds), f"no curl example for {ep}"


def check_sse(body):
    assert body.endswith("data: [DONE]\n\n"), body[-200:]
    blocks = body.split("\n\n")[:-1]
    assert len(blocks) >= 2
    for block in blocks[:-1]:
        assert block.startswith("data: "), block
        event = json.loads(block[len("data: "):])
        assert "error" not in event, event


def check_prometheus(body):
    lines = [l for l in body.splitlines() if l.strip()]
    assert lines
    for line in lines:
        assert line.startswith("#") or re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})? \S+", line), line


@pytest.mark.parametrize("cmd", examples(), ids=lambda c: c.split("localhost:8080", 1)[-1]
                         .split()[0].strip("'\\"))
def test_doc_example_runs(docs_server, cmd):
    script = CURL_WRAPPER + cmd.replace(DOC_BASE, docs_server.url)
    p = subprocess.run(["bash", "-c", script], capture_output=True, timeout=180)
    out = p.stdout.decode("utf-8")
    assert p.returncode == 0, (p.returncode, p.stderr.decode(errors="replace"), out[-500:])
    body, sep, tail = out.rpartition("\n@@STATUS ")
    assert sep, out[-500:]
    status, _, ctype = tail.partition(" ")
    assert 200 <= int(status) < 300, (status, body[:500])
    if ctype.startswith("application/json"):
        assert isinstance(json.loads(body), dict)
    elif ctype.startswith("text/event-stream"):
        check_sse(body)
    elif ctype.startswith("text/plain"):
        check_prometheus(body)
    else:
        pytest.fail(f"unexpected Content-Type {ctype!r}")
