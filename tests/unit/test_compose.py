"""docker-compose.yml: valid against the Compose specification's schema (and ``docker compose
config`` where a Docker engine with the compose plugin is installed), one worker service per GPU
(each pinned to its own device), every long-running service restarted unless stopped and with a
healthcheck; Prometheus finds every worker service; the sentinel profile's replica and Sentinels."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from inferq.cli.procs import start_redis
from tests.procs import free_port
from tests.wait import eventually

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def workers() -> dict[str, dict[str, Any]]:
    """The services that run inferq's worker, by name."""
    return {name: s for name, s in services().items() if s.get("command", [])[:2] == ["inferq", "worker"]}


def test_compose_file_is_valid_against_the_compose_spec() -> None:
    tool = Path(sys.executable).parent / "check-jsonschema"  # pinned in the test extra
    done = subprocess.run([str(tool), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def has_compose() -> bool:
    """Docker's CLI with its compose plugin (``config`` needs no engine)."""
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "compose", "version"], capture_output=True).returncode == 0


@pytest.mark.skipif(not has_compose(), reason="no docker compose here: the schema check above stands in")
def test_docker_compose_config_accepts_it() -> None:
    for profiles in ([], ["--profile", "gpu1", "--profile", "monitoring", "--profile", "sentinel"]):
        subprocess.run(["docker", "compose", "-f", str(COMPOSE), *profiles, "config", "-q"], check=True, cwd=ROOT)


def _gpus(service: dict[str, Any]) -> list[str]:
    [device] = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert "count" not in device, "count: 1 lets every replica take the same GPU; name the device"
    return device["device_ids"]


def test_one_worker_service_per_gpu_each_on_its_own_device() -> None:
    ws = workers()
    assert len(ws) >= 2, list(ws)
    ids = [_gpus(s) for s in ws.values()]
    assert all(len(i) == 1 for i in ids), ids  # one engine per GPU (tensor parallelism: a service of its own)
    assert sorted(i[0] for i in ids) == [str(n) for n in range(len(ws))], ids  # distinct: GPU 0, 1, ...
    # GPU 0's worker starts with a plain `docker compose up`; the others are opt-in, for hosts that have them
    by_gpu = {_gpus(s)[0]: s for s in ws.values()}
    assert "profiles" not in by_gpu["0"]
    assert all(s.get("profiles") for gpu, s in by_gpu.items() if gpu != "0")


def test_worker_services_differ_only_in_their_gpu() -> None:
    """They come from one YAML anchor: settings, volumes, probes and drain time are the same."""
    text = COMPOSE.read_text()
    assert len(re.findall(r"^  worker-gpu\d+:.*\n    <<: \*worker$", text, re.M)) == len(workers())
    drop = lambda s: {k: v for k, v in s.items() if k not in ("deploy", "profiles")}  # noqa: E731
    [first, *rest] = [drop(s) for s in workers().values()]
    assert all(other == first for other in rest)


@pytest.mark.parametrize("name", list(services()))
def test_every_service_restarts_and_has_a_healthcheck(name: str) -> None:
    service = services()[name]
    assert service.get("restart") == "unless-stopped", name
    check = service.get("healthcheck", {})
    assert check.get("test") and not check.get("disable"), name
    assert check["test"][0] in ("CMD", "CMD-SHELL"), name


def test_prometheus_scrapes_every_worker_service() -> None:
    """Prometheus resolves one name to every worker container: each worker service carries it as a
    network alias."""
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "inferq-worker"]
    names = {n for c in job["dns_sd_configs"] for n in c["names"]}
    for name, s in workers().items():
        aliases = set(s.get("networks", {}).get("default", {}).get("aliases", []))
        assert names & (aliases | {name}) == names, (name, names, aliases)


def _args(command: list[str]) -> dict[str, list[str]]:
    out, key = {}, None
    for a in command[1:]:
        if a.startswith("--"):
            key = a[2:]
            out[key] = []
        elif key is not None:
            out[key].append(a)
    return out


def test_sentinel_profile_replica_is_configured_as_the_master_and_three_sentinels_agree() -> None:
    """The sentinel profile's replica is what Sentinel promotes: the same persistence, cap and
    eviction policy as redis, replicating it; three Sentinels watch redis as inferq's settings name
    it, a failover needing two of them."""
    s = services()
    master, replica = _args(s["redis"]["command"]), _args(s["redis-replica"]["command"])
    assert replica.pop("replicaof") == ["redis", "6379"] and replica.pop("replica-announce-ip") == ["redis-replica"]
    assert master.pop("replica-announce-ip") == ["redis"] and replica == master
    sentinels = {n: v for n, v in s.items() if n.startswith("sentinel-")}
    assert len(sentinels) == 3 and all(v["profiles"] == ["sentinel"] for v in [*sentinels.values(), s["redis-replica"]])
    env = yaml.safe_load(COMPOSE.read_text())["x-inferq-env"]
    assert env["INFERQ_REDIS_SENTINELS"] == "${INFERQ_REDIS_SENTINELS:-}"  # empty by default: Redis itself
    for v in sentinels.values():
        assert f"'sentinel monitor {env['INFERQ_REDIS_SENTINEL_MASTER']} redis 6379 2'" in v["command"][2]


def test_the_sentinel_command_starts_a_sentinel_that_watches_the_master(tmp_path: Path) -> None:
    """The compose Sentinel's own shell command, run here: its config file is written and Sentinel
    starts on it and finds the master (the master's address made local, redis-sentinel being
    redis-server --sentinel)."""
    master = start_redis(free_port(), tmp_path, name="master")
    port = free_port()
    shim = tmp_path / "bin" / "redis-sentinel"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nexec {shutil.which('redis-server')} \"$@\" --sentinel --port {port}\n")
    shim.chmod(0o755)
    script = services()["sentinel-1"]["command"][2].replace("redis 6379", f"127.0.0.1 {master.port}")
    script = script.replace("/tmp/sentinel.conf", str(tmp_path / "sentinel.conf"))
    env = {"PATH": f"{shim.parent}:/usr/bin:/bin"}
    proc = subprocess.Popen(["sh", "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with redis.Redis(port=port, decode_responses=True) as s:
            m = eventually(lambda: s.sentinel_master("inferq"), 10, "the Sentinel watching the master",
                           ignore=(redis.ConnectionError,), procs=[proc], until=lambda m: m["flags"] == "master")
        assert (m["port"], m["quorum"], m["down-after-milliseconds"]) == (master.port, 2, 5000)
    finally:
        proc.kill()
        proc.wait()
        master.stop()


def _default(value: str) -> str:
    """A compose value with every ``${VAR:-default}`` replaced by its default."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", value)


def test_every_published_port_is_on_loopback_unless_the_operator_says_otherwise() -> None:
    """Nothing is published on every interface by default: the gateway (open without keys), Flower
    (revokes tasks, shuts workers down), Grafana and Prometheus bind to 127.0.0.1 until a variable
    names another address."""
    published = {name: s["ports"] for name, s in services().items() if s.get("ports")}
    assert set(published) >= {"api", "prometheus", "grafana", "flower"}, published
    for name, ports in published.items():
        for port in ports:
            assert re.fullmatch(r"\$\{INFERQ_(API|MONITORING)_BIND:-127\.0\.0\.1\}:\d+:\d+", port), (name, port)


def test_the_gateway_gets_the_operators_api_keys() -> None:
    """INFERQ_API_KEYS reaches the gateway, and so does a keys file (INFERQ_API_KEYS_FILE on the host,
    mounted as a secret); the default file holds no key."""
    compose = yaml.safe_load(COMPOSE.read_text())
    api = compose["services"]["api"]
    env = api["environment"]
    assert env["INFERQ_API_KEYS"] == "${INFERQ_API_KEYS:-}"
    [secret] = api["secrets"]
    assert env["INFERQ_API_KEYS_FILE"] == f"/run/secrets/{secret}"
    host = compose["secrets"][secret]["file"]
    assert host.startswith("${INFERQ_API_KEYS_FILE:-")
    from inferq.api.auth import read_keys_file

    assert read_keys_file(ROOT / _default(host)) == {}


def test_the_model_and_its_options_are_the_operators() -> None:
    """No context window is forced on every model (a 2,048-token model would stop the worker), and the
    settings an operator needs for tool calls and LoRA reach the processes, empty (the setting's
    default) unless set."""
    env = yaml.safe_load(COMPOSE.read_text())["x-inferq-env"]
    for name in ("MAX_MODEL_LEN", "TOOL_CALL_PARSER", "LORA_MODULES", "LORA_DIR", "ENABLE_LORA", "MAX_LORAS",
                 "MAX_LORA_RANK", "LORA_RUNTIME_UPDATES"):
        assert env.get(f"INFERQ_{name}") == f"${{INFERQ_{name}:-}}", name


def test_empty_variables_are_the_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compose passes an unset ``${VAR:-}`` as an empty variable: the settings read it as unset."""
    from inferq.shared.settings import Settings

    for name in ("MAX_MODEL_LEN", "MAX_LORAS", "ENABLE_LORA", "LORA_DIR", "TOOL_CALL_PARSER"):
        monkeypatch.setenv(f"INFERQ_{name}", "")
    s = Settings()
    assert (s.max_model_len, s.max_loras, s.enable_lora, s.lora_dir, s.tool_call_parser) == (None, 4, False, None,
                                                                                            None)


def test_flower_reaches_the_broker_the_operator_names() -> None:
    [broker] = [a for a in services()["flower"]["command"] if a.startswith("--broker=")]
    assert broker == "--broker=${FLOWER_BROKER_URL:-redis://redis:6379/0}"
