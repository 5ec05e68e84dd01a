"""configs/k8s/: every built-in object validates (strictly: no unknown field)
against the OpenAPI schemas of a current Kubernetes release, offline
(kubernetes-validate, pinned in tests/requirements.txt), the YAML parses, the probes point at the server's real
routes and port (the port of the ConfigMap's dolphin.yaml, which is the
default of configs/dolphin.yaml), the pod asks for a GPU, the grace period
outlasts the drain, the Service and HPA point at the Deployment, and the
ConfigMap's dolphin.yaml is a configuration dolphind accepts and serves the
probes with, the PodMonitor selects the pods and names a port they have, and
the grace period matches preStop + drain_timeout_s."""
import copy
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
import requests
import yaml

from dolphin_server import BIN, Dolphind
from ops_util import CONFIGS

K8S = CONFIGS / "k8s"


def docs():
    out = {}
    for f in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d:
                assert d.get("apiVersion") and d.get("kind") and d["metadata"]["name"], f
                out.setdefault(d["kind"], []).append(d)
    return out


def one(kind):
    (d,) = docs()[kind]
    return d


def container():
    (c,) = one("Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def configmap_settings():
    return yaml.safe_load(one("ConfigMap")["data"]["dolphin.yaml"])


def named_port(c, port):
    if isinstance(port, int):
        return port
    (p,) = [p for p in c["ports"] if p["name"] == port]
    return p["containerPort"]


KUBERNETES = "1.37.0"   # the newest release whose schemas kubernetes-validate ships


def validate(doc):
    kv = pytest.importorskip("kubernetes_validate")
    return kv.validate(doc, KUBERNETES, strict=True)


def test_schemas_of_a_current_kubernetes():
    kv = pytest.importorskip("kubernetes_validate")
    assert kv.latest_version() == KUBERNETES
    checked = []
    for kind, objs in docs().items():
        for d in objs:
            if kind == "PodMonitor":      # a CRD of the Prometheus Operator: no schema here
                with pytest.raises(kv.SchemaNotFoundError):
                    validate(d)
                continue
            validate(d)                   # raises kv.ValidationError
            checked.append(kind)
    assert sorted(checked) == ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "Service"]
    # the check can fail: an unknown field and a wrong type are refused
    dep = copy.deepcopy(one("Deployment"))
    dep["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/"
    with pytest.raises(kv.ValidationError):
        validate(dep)
    dep = copy.deepcopy(one("Deployment"))
    dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "45"
    with pytest.raises(kv.ValidationError):
        validate(dep)


def test_podmonitor_selects_the_pods():
    dep = one("Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"] for p in container()["ports"]}
    for pm in docs().get("PodMonitor", []):
        assert pm["apiVersion"] == "monitoring.coreos.com/v1"
        assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
        for ep in pm["spec"]["podMetricsEndpoints"]:
            assert ep["port"] in ports, (ep, ports)


def test_yaml_parses_and_kinds():
    kinds = docs()
    for k in ("Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap"):
        assert len(kinds.get(k, [])) == 1, (k, list(kinds))


def test_probe_paths_and_ports_match_the_server():
    c = container()
    ready, live = c["readinessProbe"]["httpGet"], c["livenessProbe"]["httpGet"]
    assert ready["path"] == "/healthz"
    assert live["path"] == "/livez"
    port = configmap_settings()["port"]
    assert named_port(c, ready["port"]) == named_port(c, live["port"]) == port
    # the ConfigMap keeps dolphind's default port (configs/dolphin.yaml)
    assert yaml.safe_load((CONFIGS / "dolphin.yaml").read_text())["port"] == port == 8080
    # reachable from the kubelet: not loopback
    assert configmap_settings()["host"] == "0.0.0.0"
    ann = one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/path"] == "/metrics" and int(ann["prometheus.io/port"]) == port
    for pm in docs().get("PodMonitor", []):
        (ep,) = pm["spec"]["podMetricsEndpoints"]
        assert ep["path"] == "/metrics" and named_port(c, ep["port"]) == port


def test_dolphind_defaults_match():
    """dolphind --help lists the port default the manifests assume."""
    if not BIN.is_file():
        pytest.skip(f"{BIN} not built")
    out = subprocess.run([str(BIN), "--help"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"--port N\b.*?default (\d+)\]", out, re.S)
    assert m and int(m.group(1)) == 8080, out


def test_gpu_request_and_graceful_termination():
    c = container()
    res = c["resources"]
    assert int(res["limits"]["nvidia.com/gpu"]) >= 1
    assert int(res["requests"].get("nvidia.com/gpu", res["limits"]["nvidia.com/gpu"])) == \
        int(res["limits"]["nvidia.com/gpu"])
    spec = one("Deployment")["spec"]["template"]["spec"]
    drain = configmap_settings().get("drain_timeout_s", 30)
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    # SIGTERM comes after preStop; the drain must fit in what is left, with
    # a margin for the exit, and no more than that margin
    grace = spec["terminationGracePeriodSeconds"]
    assert drain + pre_stop < grace <= drain + pre_stop + 15, (grace, drain, pre_stop)
    args = c["args"]
    assert args[args.index("--config") + 1].startswith(c["volumeMounts"][0]["mountPath"])


def test_service_and_hpa_point_at_the_deployment():
    dep = one("Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    svc = one("Service")
    assert svc["spec"]["selector"].items() <= labels.items()
    (sp,) = svc["spec"]["ports"]
    assert named_port(container(), sp["targetPort"]) == configmap_settings()["port"]
    hpa = one("HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    assert ref["kind"] == "Deployment" and ref["name"] == dep["metadata"]["name"]
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["config"]["configMap"]["name"] == one("ConfigMap")["metadata"]["name"]


def test_configmap_config_runs_and_serves_the_probes():
    """dolphind accepts the ConfigMap's dolphin.yaml as it is (only the model
    directory, host and port overridden for this machine) and answers the
    probes on their paths."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(one("ConfigMap")["data"]["dolphin.yaml"])
        path = f.name
    try:
        srv = Dolphind("stories260K", ["--config", path])
        try:
            c = container()
            for probe in ("readinessProbe", "livenessProbe"):
                r = requests.get(srv.url + c[probe]["httpGet"]["path"], timeout=30)
                assert r.status_code == 200, (probe, r.text)
            # the drain timeout the grace period was sized for is the one in use
            h = requests.get(srv.url + "/healthz", timeout=30).json()
            assert h["memory"]["unready_ratio"] == configmap_settings()["vram_unready_ratio"]
        finally:
            srv.stop()
    finally:
        Path(path).unlink()
