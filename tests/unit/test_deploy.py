"""deploy/: the Kubernetes manifests validate against Kubernetes' schemas and agree with the code
(setting names, queue names, metric names, drain timing); Prometheus' config and alert rules pass
promtool; the Grafana dashboard and the compose profile name only what exists."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from inferq.api import queue_metrics
from inferq.api.metrics import REQUESTS  # noqa: F401  (registers the gateway's metrics)
from inferq.shared import keys
from inferq.shared.schemas import JobRequest
from inferq.shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KEDA = "keda.sh/v1alpha1"


def _docs() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return [d for f in kustomization["resources"] for d in yaml.safe_load_all((K8S / f).read_text()) if d]


def _one(kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _config() -> dict[str, str]:
    return _one("ConfigMap", "inferq-config")["data"]


def _settings() -> Settings:
    return Settings(**{k.removeprefix("INFERQ_").lower(): v for k, v in _config().items()})


def _metric_names() -> set[str]:
    """Every series name the gateway and the worker can export (vLLM's own: VLLM_METRICS)."""
    from prometheus_client import REGISTRY

    import inferq.worker.metrics

    snap = queue_metrics.QueueSnapshot(0.0)
    collectors = [REGISTRY, queue_metrics.QueueCollector(snap),
                  inferq.worker.metrics.WorkerCollector(_Idle(), "m", 0)]
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""]}
    names = {fam.name + sfx for c in collectors for fam in c.collect() for sfx in suffixes.get(fam.type, [""])}
    return names | {"inferq_redis_up"}


class _Idle:
    id, draining = "w", False

    def held_jobs(self) -> int:
        return 0

    def last_beat(self) -> float | None:
        return None


def test_every_kubernetes_resource_validates() -> None:
    docs = _docs()
    assert {d["kind"] for d in docs} >= {"Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap",
                                         "ScaledObject"}
    for doc in docs:
        if doc["apiVersion"] != KEDA:  # a CRD: not in Kubernetes' schemas, checked below
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_kustomize_renders_every_resource_in_the_namespace() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:  # what kustomize needs: no resource pins another namespace than the kustomization's
        assert all("namespace" not in d["metadata"] for d in _docs())
        return
    out = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, check=True).stdout
    rendered = [d for d in yaml.safe_load_all(out) if d]
    namespace = yaml.safe_load((K8S / "kustomization.yaml").read_text())["namespace"]
    assert len(rendered) == len(_docs())
    assert all(d["metadata"].get("namespace") == namespace for d in rendered if d["kind"] != "Namespace")


def _render(folder: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl renders the kustomization (its replacements); not installed here")
    out = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_renaming_the_model_or_the_namespace_reaches_every_trigger(tmp_path: Path) -> None:
    """Each is written once (config.yaml's served name, the kustomization's namespace): the rendered
    ScaledObject's list names, query and Redis address follow a rename, so scale-from-zero keeps
    working (a name written by hand in eleven triggers was missed silently)."""
    folder = tmp_path / "k8s"
    shutil.copytree(K8S, folder)
    model, namespace = "org/Mistral-7B-Instruct-v0.2", "llm-prod"
    config = folder / "config.yaml"
    config.write_text(re.sub(r"INFERQ_SERVED_MODEL_NAME: .*", f"INFERQ_SERVED_MODEL_NAME: {model}", config.read_text()))
    kust = folder / "kustomization.yaml"
    kust.write_text(re.sub(r"(?m)^namespace: .*", f"namespace: {namespace}", kust.read_text()))
    [so] = [d for d in _render(folder) if d["kind"] == "ScaledObject"]
    reds = [t["metadata"] for t in so["spec"]["triggers"] if t["type"] == "redis"]
    [prom] = [t["metadata"] for t in so["spec"]["triggers"] if t["type"] == "prometheus"]
    assert [r["listName"] for r in reds] == keys.queue_lists(model)
    assert {r["address"] for r in reds} == {f"redis.{namespace}.svc:6379"}
    assert f'inferq_jobs{{model="{model}"}}' in prom["query"]
    # and as shipped, the rendered triggers name the shipped model and namespace
    [shipped] = [d for d in _render(K8S) if d["kind"] == "ScaledObject"]
    assert shipped["spec"]["triggers"] == _one("ScaledObject", "worker")["spec"]["triggers"]


def test_the_image_is_a_release_from_a_registry_pulled_once() -> None:
    """Not ``inferq:latest``: a bare name is looked up on Docker Hub and ``latest`` is pulled on every
    start (ErrImagePull until someone retags it, or another build on each node)."""
    from importlib.metadata import version

    [image] = yaml.safe_load((K8S / "kustomization.yaml").read_text())["images"]
    registry = image["newName"].split("/")[0]
    assert "/" in image["newName"] and ("." in registry or ":" in registry), image
    assert image["newTag"] == version("inferq") != "latest"
    for name in ("gateway", "worker"):
        [c] = _one("Deployment", name)["spec"]["template"]["spec"]["containers"]
        assert c["image"] == image["name"] and c["imagePullPolicy"] == "IfNotPresent", name


def test_keys_and_the_hub_token_come_from_a_secret() -> None:
    """The gateway reads its keys file from the Secret and does not start without it (never without
    auth by accident); workers take HF_TOKEN from it where it is set."""
    spec = _one("Deployment", "gateway")["spec"]["template"]["spec"]
    [c] = spec["containers"]
    env = {e["name"]: e for e in c["env"]}
    [mount] = [m for m in c["volumeMounts"] if env["INFERQ_API_KEYS_FILE"]["value"].startswith(m["mountPath"] + "/")]
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "inferq-secrets" and not volume["secret"].get("optional")
    assert [i["path"] for i in volume["secret"]["items"]] == [env["INFERQ_API_KEYS_FILE"]["value"].rsplit("/", 1)[1]]
    [w] = _one("Deployment", "worker")["spec"]["template"]["spec"]["containers"]
    token = {e["name"]: e for e in w["env"]}["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token["name"] == "inferq-secrets" and token["optional"] is True


def test_workers_share_one_model_cache() -> None:
    """A worker KEDA starts from zero finds the weights on a volume every worker pod mounts (an
    emptyDir downloaded them again for each pod)."""
    spec = _one("Deployment", "worker")["spec"]["template"]["spec"]
    [c] = spec["containers"]
    [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == "/root/.cache/huggingface"]
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    claim = _one("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_the_config_holds_only_real_settings() -> None:
    fields = set(Settings.model_fields)
    for name in _config():
        assert name.startswith("INFERQ_") and name.removeprefix("INFERQ_").lower() in fields, name
    _settings()  # and every value parses


def test_workers_drain_within_their_grace_period_on_one_gpu() -> None:
    s = _settings()
    spec = _one("Deployment", "worker")["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] >= s.drain_timeout_s + 30
    [c] = spec["containers"]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 1 and c["resources"]["limits"]["nvidia.com/gpu"] == 1
    port = c["ports"][0]
    assert port["containerPort"] == s.metrics_port
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["readinessProbe"]["httpGet"]["port"] == port["name"]


def test_keda_scales_workers_on_the_models_own_queue() -> None:
    s, so = _settings(), _one("ScaledObject", "worker")
    assert so["apiVersion"] == KEDA and so["spec"]["scaleTargetRef"]["name"] == "worker"
    assert so["spec"]["minReplicaCount"] == 0  # scale to zero
    [prom] = [t["metadata"] for t in so["spec"]["triggers"] if t["type"] == "prometheus"]
    reds = [t["metadata"] for t in so["spec"]["triggers"] if t["type"] == "redis"]
    # one trigger per priority list: a job queued at any priority (batches: 9) wakes the workers
    assert [r["listName"] for r in reds] == keys.queue_lists(s.model_name)
    assert JobRequest.model_fields["priority"].default in keys.PRIORITIES and s.batch_priority in keys.PRIORITIES
    assert int(prom["threshold"]) == s.max_num_seqs and int(prom["activationThreshold"]) == 0
    for red in reds:
        assert int(red["listLength"]) == s.max_num_seqs and int(red["activationListLength"]) == 0
        assert red["address"].split(".")[0] == _one("Service", "redis")["metadata"]["name"]
    assert f'model="{s.model_name}"' in prom["query"]
    for metric in re.findall(r"\b(inferq_[a-z_]+)\{", prom["query"]):
        assert metric in _metric_names(), metric


def test_prometheus_config_and_alert_rules_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool comes with the prometheus package (make setup installs it)"
    base = ROOT / "deploy" / "prometheus"
    subprocess.run([promtool, "check", "config", "--syntax-only", str(base / "prometheus.yml")], check=True)
    subprocess.run([promtool, "check", "rules", str(base / "alerts.yml")], check=True)


def test_failing_jobs_alert_counts_the_services_failures_not_its_clients(tmp_path: Path) -> None:
    """promtool runs InferqJobsFailing over ten minutes of jobs: a model whose jobs fail for their
    clients' input (status="invalid") alerts nobody; one whose jobs fail for the service does."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool comes with the prometheus package (make setup installs it)"
    rules = ROOT / "deploy" / "prometheus" / "alerts.yml"
    [rule] = [r for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]
              if r.get("alert") == "InferqJobsFailing"]
    series = {'{model="clients",status="invalid",code="invalid_value"}': "0+10x40",
              '{model="clients",status="succeeded",code=""}': "0+10x40",
              '{model="service",status="failed",code="engine_error"}': "0+10x40",
              '{model="service",status="succeeded",code=""}': "0+10x40"}
    test = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": f"inferq_jobs_finished_total{k}", "values": v} for k, v in series.items()],
        "alert_rule_test": [{"eval_time": "30m", "alertname": "InferqJobsFailing", "exp_alerts": [{
            "exp_labels": {**rule["labels"], "model": "service"},
            "exp_annotations": {"summary": rule["annotations"]["summary"].replace("{{ $labels.model }}", "service")},
        }]}],
    }]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    done = subprocess.run([promtool, "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _exprs() -> list[str]:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    dash = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "inferq.json").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]] + \
        [t["expr"] for p in dash["panels"] for t in p["targets"]]


@pytest.mark.parametrize("expr", _exprs())
def test_dashboards_and_alerts_name_only_exported_metrics(expr: str) -> None:
    names = _metric_names()
    for metric in re.findall(r"\b((?:inferq_|vllm:)[a-z_:]+)", expr):
        if metric.startswith("vllm:"):
            assert metric in VLLM_METRICS, metric
        else:
            assert metric in names, metric


#: vLLM's standard metric names the dashboards use (vllm/v1/metrics/loggers.py), as a worker serves them.
VLLM_METRICS = {"vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                "vllm:inter_token_latency_seconds_bucket", "vllm:kv_cache_usage_perc",
                "vllm:num_requests_running", "vllm:num_requests_waiting"}


def test_compose_monitoring_profile_mounts_what_exists() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    for name in ("prometheus", "grafana", "flower"):
        assert services[name]["profiles"] == ["monitoring"], name
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            assert (ROOT / volume.split(":")[0]).exists(), volume


def _redis_args(args: list[str]) -> dict[str, str]:
    return {a.removeprefix("--"): b for a, b in zip(args, args[1:], strict=False) if a.startswith("--")}


def test_shipped_redis_is_capped_and_refuses_writes_when_full() -> None:
    """Compose and Kubernetes cap Redis' memory (a flood of uploads or jobs must not grow it until
    the host kills it) and never evict (a job or its log would vanish): writes are refused at the
    cap, below the container's memory limit."""
    compose = _redis_args(yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["redis"]["command"])
    assert compose["maxmemory-policy"] == "noeviction" and compose["maxmemory"] == "${REDIS_MAXMEMORY:-2gb}"
    container = _one("Deployment", "redis")["spec"]["template"]["spec"]["containers"][0]
    k8s = _redis_args(container["args"])
    assert k8s["maxmemory-policy"] == "noeviction" and k8s["maxmemory"] == "3gb"
    assert container["resources"]["limits"]["memory"] == "4Gi"


def test_compose_prometheus_scrapes_every_process_of_the_workers_engine_group() -> None:
    """Process i of an engine group serves its metrics on INFERQ_METRICS_PORT + i: Prometheus scrapes
    as many ports as the compose file's default INFERQ_FRONTENDS."""
    import re

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    env = compose["services"]["worker-gpu0"]["environment"]
    frontends = int(re.fullmatch(r"\$\{INFERQ_FRONTENDS:-(\d+)\}", env["INFERQ_FRONTENDS"])[1])
    base = int(env["INFERQ_METRICS_PORT"])
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "inferq-worker"]
    assert sorted(c["port"] for c in job["dns_sd_configs"]) == list(range(base, base + frontends))


def test_kubernetes_workers_are_engine_groups_as_in_compose_and_every_process_is_scraped() -> None:
    """worker.yaml runs the compose file's default INFERQ_FRONTENDS, names one container port per
    process (INFERQ_METRICS_PORT + i), and podmonitor.yaml scrapes each of them."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    default = re.fullmatch(r"\$\{INFERQ_FRONTENDS:-(\d+)\}",
                           compose["services"]["worker-gpu0"]["environment"]["INFERQ_FRONTENDS"])
    [c] = _one("Deployment", "worker")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    frontends = int(env["INFERQ_FRONTENDS"])
    assert frontends == int(default[1])
    assert [p["containerPort"] for p in c["ports"]] == list(range(_settings().metrics_port,
                                                                  _settings().metrics_port + frontends))
    monitor = yaml.safe_load((K8S / "podmonitor.yaml").read_text())
    assert monitor["kind"] == "PodMonitor"
    assert monitor["spec"]["selector"]["matchLabels"] == \
        _one("Deployment", "worker")["spec"]["selector"]["matchLabels"]
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == [p["name"] for p in c["ports"]]
