"""docs/openapi.yaml is the contract of Dolphin's HTTP API; these tests hold
the server to it.

- The document is valid OpenAPI 3.1 (the official 3.1 schema, as shipped with
  schemathesis), every $ref resolves, every schema compiles.
- Every route of the server's route table (ROUTES in src/http/server.c) is in
  it with its method (GET routes with HEAD as well), and it has no others.
- schemathesis runs every operation against a live dolphind (stories260K)
  with every check (`--checks all`: no 5xx, status codes, content types,
  headers and bodies as documented, invalid data rejected, valid data
  accepted, 405 with Allow for undocumented methods, ...) plus the stream
  check of openapi_hooks.py, with a fixed seed and a bounded number of
  examples per operation. Its hooks (openapi_hooks.py) fit the generated
  bodies to the served model without changing their validity; see there.

The run prints one line, `schemathesis: N test cases ...`, with the number of
cases sent. DOLPHIN_OPENAPI_EXAMPLES sets the examples per operation (default
50), DOLPHIN_OPENAPI_SEED the seed.
"""
import os
import re
import subprocess
import sys
import time

import jsonschema_rs
import pytest
import yaml

from dolphin_server import REPO, Dolphind

SPEC = REPO / "docs" / "openapi.yaml"
SERVER_C = REPO / "src" / "http" / "server.c"
HERE = REPO / "tests" / "http"
SCHEMATHESIS = REPO / ".venv" / "bin" / "schemathesis"
SEED = int(os.environ.get("DOLPHIN_OPENAPI_SEED", "20251201"))
EXAMPLES = int(os.environ.get("DOLPHIN_OPENAPI_EXAMPLES", "50"))
MODEL = "stories260K"
VOCAB = 512

# Streams are read to the end; statuses that count as refusing invalid data:
# schemathesis's defaults plus 413, the answer to a body over max_body_bytes
# (the generator can make one).
CONFIG = """
# Read every stream to its end (the default stops after a few events).
max-stream-events = 100000

[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415",
                     "422", "428", "429", "5xx"]
"""


def load_spec():
    return yaml.safe_load(SPEC.read_text())


# ---- the document ------------------------------------------------------------

def _refs(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield path, v
            else:
                yield from _refs(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _refs(v, f"{path}/{i}")


def test_spec_is_valid_openapi_31():
    from schemathesis.specs.openapi.definitions import OPENAPI_31

    spec = load_spec()
    assert spec["openapi"] == "3.1.0"
    errors = [f"{e.instance_path}: {e.message}"[:300]
              for e in jsonschema_rs.validator_for(OPENAPI_31).iter_errors(spec)]
    assert not errors, "\n".join(errors[:20])
    for where, ref in _refs(spec):
        assert ref.startswith("#/"), f"{where}: external $ref {ref}"
        node = spec
        for part in ref[2:].split("/"):
            assert isinstance(node, dict) and part in node, f"{where}: $ref {ref} does not resolve"
            node = node[part]
    # Every schema compiles as JSON Schema 2020-12 (OpenAPI 3.1's dialect).
    for name, schema in spec["components"]["schemas"].items():
        root = {"$schema": "https://json-schema.org/draft/2020-12/schema",
                "components": spec["components"], "$ref": f"#/components/schemas/{name}"}
        jsonschema_rs.validator_for(root)
    # Every operation has an operationId, and every response X-Request-Id.
    ids = []
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method == "parameters":
                continue
            ids.append(op["operationId"])
            for status, resp in op["responses"].items():
                if "$ref" in resp:
                    resp = spec["components"]["responses"][resp["$ref"].rsplit("/", 1)[1]]
                assert "X-Request-Id" in resp.get("headers", {}), f"{method} {path} {status}"
    assert len(ids) == len(set(ids))


def server_routes():
    """(path, method) of every entry of ROUTES in src/http/server.c, with the
    prefix route /v1/models/ as the spec's /v1/models/{model}."""
    src = SERVER_C.read_text()
    table = re.search(r"\bROUTES\[\]\s*=\s*\{(.*?)\n\};", src, re.S)
    assert table, "ROUTES not found in src/http/server.c"
    rows = re.findall(r'\{\s*"([^"]+)",\s*(true|false),\s*"([A-Z]+)"', table.group(1))
    assert len(rows) >= 9, rows
    out = []
    for path, prefix, method in rows:
        if prefix == "true":
            assert path.endswith("/"), path
            path = path + "{model}"
        out.append((path, method))
    return out


def test_every_route_is_in_the_spec():
    spec = load_spec()
    routes = server_routes()
    for path, method in routes:
        assert path in spec["paths"], f"{method} {path} (src/http/server.c ROUTES) is not in docs/openapi.yaml"
        ops = set(spec["paths"][path]) - {"parameters"}
        want = {"get", "head"} if method == "GET" else {method.lower()}
        assert ops == want, f"{path}: the spec has {sorted(ops)}, the server answers {sorted(want)}"
    assert set(spec["paths"]) == {p for p, _ in routes}, "the spec has paths the server does not route"


# ---- schemathesis against a live server --------------------------------------

@pytest.fixture(scope="module")
def openapi_server():
    srv = Dolphind(MODEL)
    yield srv
    srv.stop()


def test_schemathesis(openapi_server, tmp_path):
    if not SCHEMATHESIS.is_file():
        pytest.skip(f"{SCHEMATHESIS} not installed (scripts/setup.sh installs tests/requirements.txt)")
    srv = openapi_server
    cfg = tmp_path / "schemathesis.toml"
    cfg.write_text(CONFIG)
    env = dict(os.environ,
               SCHEMATHESIS_HOOKS="openapi_hooks",
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
               DOLPHIN_OPENAPI_MODEL=MODEL,
               DOLPHIN_OPENAPI_VOCAB=str(VOCAB),
               NO_COLOR="1")
    cmd = [str(SCHEMATHESIS), "--config-file", str(cfg), "run", str(SPEC),
           "--url", srv.url,
           "--checks", "all",
           "--seed", str(SEED),
           "--max-examples", str(EXAMPLES),
           "--workers", "1",
           # The server refuses NUL in any string of a body (docs/robustness.md).
           "--generation-allow-x00", "false",
           "--generation-database", "none",
           "--request-timeout", "30",
           "--output-sanitize", "false",
           "--output-truncate", "true",
           "--report", "ndjson", "--report-ndjson-path", str(tmp_path / "events.ndjson"),
           "--no-color"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    m = re.search(r"Test cases:\s*\n\s*(\d+) generated(.*)", out)
    cases = int(m.group(1)) if m else -1
    ops = re.search(r"Tested:\s*(\d+)", out)
    summary = (f"schemathesis: {cases} test cases generated and sent "
               f"({m.group(2).strip(', ') if m else '?'}) over "
               f"{ops.group(1) if ops else '?'} operations, seed {SEED}, "
               f"max {EXAMPLES} examples per operation, {took:.1f} s")
    print("\n" + summary)
    sys.stdout.flush()
    assert proc.returncode == 0, f"{summary}\n{out[-20000:]}\n--- server log ---\n{srv.log()[-3000:]}"
    assert ops and int(ops.group(1)) == 14, out[-3000:]
    assert cases > 0
    # The server is still well after it.
    import requests
    assert requests.get(srv.url + "/healthz", timeout=10).status_code == 200
