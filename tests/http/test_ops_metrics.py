"""GET /metrics: the Prometheus text format checked by the real promtool
after traffic, the families of docs/deployment.md with their types and units, counters
and histograms that follow the traffic, gauges that agree with /healthz;
the alert rules (promtool check rules / test rules / check config) and every
metric name the alerts, the Grafana dashboard and the HPA use exists in the
live output."""
import json
import re

import pytest
import requests
import yaml

from dolphin_server import API_KEY, Dolphind
from ops_util import (CONFIGS, family_of, get_metrics, grafana_queries, parse_exposition,
                      promql_metric_names, promtool, value)

# name -> type: the families /metrics always declares
FAMILIES = {
    "dolphin_build_info": "gauge",
    "dolphin_ready": "gauge",
    "dolphin_draining": "gauge",
    "dolphin_requests_total": "counter",
    "dolphin_request_duration_seconds": "histogram",
    "dolphin_queue_time_seconds": "histogram",
    "dolphin_time_to_first_token_seconds": "histogram",
    "dolphin_time_per_output_token_seconds": "histogram",
    "dolphin_prompt_tokens_total": "counter",
    "dolphin_generation_tokens_total": "counter",
    "dolphin_inflight_requests": "gauge",
    "dolphin_queue_depth": "gauge",
    "dolphin_running_requests": "gauge",
    "dolphin_running_sequences": "gauge",
    "dolphin_kv_cache_blocks_used": "gauge",
    "dolphin_kv_cache_blocks_capacity": "gauge",
    "dolphin_kv_cache_block_size_tokens": "gauge",
    "dolphin_kv_cache_usage_ratio": "gauge",
    "dolphin_kv_cache_tokens_capacity": "gauge",
    "dolphin_kv_cache_full_contexts": "gauge",
    "dolphin_kv_cache_info": "gauge",
    "dolphin_device_memory_used_bytes": "gauge",
    "dolphin_device_memory_total_bytes": "gauge",
    "dolphin_gpu_utilization_ratio": "gauge",
    "dolphin_weight_bytes": "gauge",
    "dolphin_scheduler_steps_total": "counter",
    "dolphin_scheduler_heartbeat_age_seconds": "gauge",
}
# Families declared with no sample on a machine without NVML (the value is
# unknown there; declaring the family keeps the name valid for rules and
# dashboards without reporting a made-up number).
NVML_ONLY = {"dolphin_gpu_utilization_ratio"}
# Series Prometheus itself adds (not exported by dolphind).
PROMETHEUS_OWN = {"up", "scrape_duration_seconds"}

COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def dolphin():
    srv = Dolphind("stories260K")
    yield srv
    srv.stop()


def traffic(url):
    """A bit of everything: plain and streamed completions, n > 1, errors."""
    out = []
    r = requests.post(url + COMPLETIONS, json={"prompt": "Once", "max_tokens": 12,
                                               "temperature": 0}, timeout=60)
    assert r.status_code == 200
    out.append(r.json()["usage"])
    r = requests.post(url + COMPLETIONS, json={"prompt": ["The cat", "A dog"], "n": 2,
                                               "max_tokens": 7}, timeout=60)
    assert r.status_code == 200
    out.append(r.json()["usage"])
    with requests.post(url + COMPLETIONS, json={"prompt": "Tom", "max_tokens": 9, "stream": True,
                                                "stream_options": {"include_usage": True}},
                       stream=True, timeout=60) as r:
        assert r.status_code == 200
        events = [json.loads(b[6:]) for b in r.content.split(b"\n\n")
                  if b.startswith(b"data: {")]
    out.append(events[-1]["usage"])
    assert requests.post(url + COMPLETIONS, json={"prompt": "x", "max_tokens": -2},
                         timeout=60).status_code == 400
    assert requests.get(url + "/no/such/route", timeout=60).status_code == 404
    assert requests.head(url + "/healthz", timeout=60).status_code == 200
    return out


def scrape(url):
    r = get_metrics(url)
    return r, *parse_exposition(r.text)


def test_promtool_check_metrics_after_traffic(dolphin):
    traffic(dolphin.url)
    r = get_metrics(dolphin.url)
    p = promtool("check", "metrics", stdin=r.text)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), \
        f"promtool check metrics:\n{p.stdout}{p.stderr}\n---\n{r.text}"


def test_content_type_and_head(dolphin):
    r = get_metrics(dolphin.url)
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert r.headers["X-Request-Id"]
    h = requests.head(dolphin.url + "/metrics", timeout=30)
    assert h.status_code == 200 and h.content == b""


def test_families_types_and_units(dolphin):
    traffic(dolphin.url)
    _, families, samples = scrape(dolphin.url)
    for name, typ in FAMILIES.items():
        assert families.get(name) == typ, f"{name}: {families.get(name)} (want {typ})"
    for name, typ in families.items():
        assert name.startswith("dolphin_"), name
        if typ == "counter":
            assert name.endswith("_total"), name
        else:
            assert not name.endswith("_total"), name
    for name in families:
        has = any(family_of(n, families) == name for n, _, _ in samples)
        assert has or name in NVML_ONLY, f"{name} has no sample"
    (info,) = [l for n, l, _ in samples if n == "dolphin_build_info"]
    assert info["backend"] == "cpu" and info["model"] == "stories260K" and info["version"]


def test_histograms_well_formed(dolphin):
    traffic(dolphin.url)
    _, families, samples = scrape(dolphin.url)
    hists = [n for n, t in families.items() if t == "histogram"]
    for h in hists:
        routes = {l["route"] for n, l, _ in samples if n == h + "_count"}
        for route in routes:
            buckets = [(l["le"], v) for n, l, v in samples
                       if n == h + "_bucket" and l["route"] == route]
            les = [float(le) for le, _ in buckets]
            assert les == sorted(les) and les[-1] == float("inf"), (h, route, les)
            assert len(les) >= 10, f"{h}: only {len(les)} buckets"
            counts = [v for _, v in buckets]
            assert counts == sorted(counts), (h, route, counts)
            assert counts[-1] == value(samples, h + "_count", route=route)
            assert value(samples, h + "_sum", route=route) >= 0
    # the latency histograms have a bucket at the 500 ms alert threshold
    for h in ("dolphin_request_duration_seconds", "dolphin_time_to_first_token_seconds"):
        les = {l["le"] for n, l, _ in samples if n == h + "_bucket"}
        assert "0.5" in les, (h, les)


def test_counters_follow_traffic(dolphin):
    _, _, before = scrape(dolphin.url)
    usages = traffic(dolphin.url)
    _, _, after = scrape(dolphin.url)

    def delta(name, **labels):
        return (value(after, name, **labels) or 0) - (value(before, name, **labels) or 0)

    assert delta("dolphin_requests_total", route=COMPLETIONS, status="200") == 3
    assert delta("dolphin_requests_total", route=COMPLETIONS, status="400") == 1
    assert delta("dolphin_requests_total", route="unknown", status="404") == 1
    assert delta("dolphin_requests_total", route="/healthz", status="200") >= 1
    assert delta("dolphin_prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert delta("dolphin_generation_tokens_total") == sum(u["completion_tokens"] for u in usages)
    assert delta("dolphin_request_duration_seconds_count", route=COMPLETIONS) == 4
    # the three completions that reached the scheduler (the 400 did not)
    assert delta("dolphin_time_to_first_token_seconds_count", route=COMPLETIONS) == 3
    assert delta("dolphin_queue_time_seconds_count", route=COMPLETIONS) == 3
    assert delta("dolphin_time_per_output_token_seconds_count", route=COMPLETIONS) == 3
    assert delta("dolphin_scheduler_steps_total") > 0
    # the per-token time is per sequence: well under the whole duration
    tpot = delta("dolphin_time_per_output_token_seconds_sum", route=COMPLETIONS) / 3
    dur = delta("dolphin_request_duration_seconds_sum", route=COMPLETIONS) / 4
    assert 0 < tpot < dur


def test_gauges_agree_with_healthz(dolphin):
    _, families, samples = scrape(dolphin.url)
    h = requests.get(dolphin.url + "/healthz", timeout=30).json()
    assert value(samples, "dolphin_ready") == 1 and h["ready"] is True
    assert value(samples, "dolphin_draining") == 0
    assert value(samples, "dolphin_kv_cache_blocks_capacity") == h["kv_cache"]["blocks_total"]
    assert value(samples, "dolphin_kv_cache_block_size_tokens") == h["kv_cache"]["block_size"]
    assert value(samples, "dolphin_device_memory_total_bytes") == h["memory"]["total_bytes"] > 0
    assert value(samples, "dolphin_weight_bytes") == h["memory"]["weight_bytes"] > 0
    assert 0 <= value(samples, "dolphin_kv_cache_usage_ratio") <= 1
    for g in ("dolphin_queue_depth", "dolphin_running_sequences", "dolphin_inflight_requests"):
        assert value(samples, g) >= 0
    gpu = value(samples, "dolphin_gpu_utilization_ratio")
    if h["memory"]["gpu_utilization_ratio"] is None:
        assert gpu is None   # no NVML: declared, no sample
    else:
        assert 0 <= gpu <= 1


def test_running_gauges_during_generation(dolphin):
    """While a long request runs, the batch and KV gauges show it."""
    import threading
    body = {"prompt": "Once", "max_tokens": 400, "ignore_eos": True, "n": 3}
    t = threading.Thread(target=requests.post, args=(dolphin.url + COMPLETIONS,),
                         kwargs={"json": body, "timeout": 120})
    t.start()
    try:
        seen = None
        for _ in range(400):
            _, _, s = scrape(dolphin.url)
            if value(s, "dolphin_running_sequences") == 3:
                seen = s
                break
        assert seen, "never saw the 3 sequences running"
        assert value(seen, "dolphin_running_requests") == 1
        assert value(seen, "dolphin_inflight_requests") == 1
        assert value(seen, "dolphin_kv_cache_blocks_used") > 0
        assert value(seen, "dolphin_device_memory_used_bytes") > 0
    finally:
        t.join(timeout=120)


# ---- alerts, dashboard, HPA -------------------------------------------------------

def alert_rules():
    doc = yaml.safe_load((CONFIGS / "prometheus" / "alerts.yaml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_promtool_check_rules():
    p = promtool("check", "rules", "configs/prometheus/alerts.yaml")
    assert p.returncode == 0, p.stdout + p.stderr


def test_promtool_test_rules():
    """The rules fire on synthetic series that break them, and only then."""
    p = promtool("test", "rules", "configs/prometheus/alerts.test.yaml")
    assert p.returncode == 0, p.stdout + p.stderr


def test_promtool_check_config():
    p = promtool("check", "config", "configs/prometheus/prometheus.yml")
    assert p.returncode == 0, p.stdout + p.stderr


def test_alerts_cover_the_spec():
    rules = {r["alert"]: r for r in alert_rules()}
    gpu = rules["DolphinGPUUtilizationHigh"]
    assert "dolphin_gpu_utilization_ratio" in gpu["expr"] and "0.80" in gpu["expr"]
    assert gpu["for"] == "5m"
    mem = rules["DolphinDeviceMemoryHigh"]
    assert "dolphin_device_memory_used_bytes" in mem["expr"] and "0.90" in mem["expr"]
    lat = rules["DolphinLatencyP99High"]
    assert re.search(r"histogram_quantile\(\s*0\.99", lat["expr"]) and "0.5" in lat["expr"]
    assert "DolphinErrorRateHigh" in rules
    for r in rules.values():
        assert r["labels"]["severity"] in ("warning", "critical")
        assert r["annotations"]["summary"]


def used_names():
    """{source: set of metric names} for the alerts, the dashboard and the HPA."""
    out = {}
    for r in alert_rules():
        out.setdefault("alerts.yaml", set()).update(promql_metric_names(r["expr"]))
    dash = json.loads((CONFIGS / "grafana" / "dolphin.json").read_text())
    for e in grafana_queries(dash):
        out.setdefault("dolphin.json", set()).update(promql_metric_names(e))
    for doc in yaml.safe_load_all((CONFIGS / "k8s" / "hpa.yaml").read_text()):
        for m in doc["spec"]["metrics"]:
            if m["type"] in ("Pods", "Object", "External"):
                key = m["type"].lower()
                out.setdefault("hpa.yaml", set()).add(m[key]["metric"]["name"])
    return out


def test_promql_name_extraction():
    assert promql_metric_names(
        'histogram_quantile(0.99, sum by (instance, le) (rate(x_bucket{a="b",c=~"d|e"}[5m]))) > 0.5'
    ) == {"x_bucket"}
    assert promql_metric_names("a / on (instance) group_left b > bool 1e-9") == {"a", "b"}
    assert promql_metric_names('rate(y_total[$__rate_interval]) and z offset 5m') == {"y_total", "z"}


def test_every_metric_name_used_exists_in_live_output(dolphin):
    traffic(dolphin.url)
    _, families, samples = scrape(dolphin.url)
    sampled = {family_of(n, families) for n, _, _ in samples}
    names = used_names()
    assert names["alerts.yaml"] and names["dolphin.json"] and names["hpa.yaml"]
    missing, unsampled = [], []
    for src, ns in sorted(names.items()):
        for n in sorted(ns - PROMETHEUS_OWN):
            fam = family_of(n, families)
            if fam is None:
                missing.append(f"{src}: {n}")
            elif fam not in sampled:
                unsampled.append(fam)
    assert not missing, "names not in /metrics: " + ", ".join(missing)
    # only the NVML family may lack samples here (it has one where NVML is)
    assert set(unsampled) <= NVML_ONLY, unsampled
    # and the dashboard shows every family /metrics exports, except metadata
    shown = {family_of(n, families) for n in names["dolphin.json"]}
    assert set(FAMILIES) - shown <= {"dolphin_draining", "dolphin_kv_cache_block_size_tokens"}, \
        set(FAMILIES) - shown


def test_dashboard_is_grafana_json():
    dash = json.loads((CONFIGS / "grafana" / "dolphin.json").read_text())
    assert dash["title"] and dash["uid"] and isinstance(dash["schemaVersion"], int)
    ids = []

    def walk(panels):
        for p in panels:
            ids.append(p["id"])
            assert p["type"] in ("row", "timeseries", "stat", "gauge", "bargauge", "table"), p
            assert {"h", "w", "x", "y"} <= set(p["gridPos"])
            assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
            if p["type"] != "row":
                assert p["targets"] and all(t["expr"] for t in p["targets"])
            walk(p.get("panels", []))

    walk(dash["panels"])
    assert len(ids) == len(set(ids))


def test_probes_and_metrics_open_with_api_keys():
    """With API keys configured, probes and scrapes need no key; the API does."""
    srv = Dolphind("stories260K", ["--api-key", API_KEY])
    try:
        for path in ("/healthz", "/livez", "/metrics"):
            assert requests.get(srv.url + path, timeout=30).status_code == 200, path
        r = requests.get(srv.url + "/v1/models", timeout=30)
        assert r.status_code == 401
        _, _, s = scrape(srv.url)
        assert value(s, "dolphin_requests_total", route="/v1/models", status="401") == 1
    finally:
        srv.stop()
