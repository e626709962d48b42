"""docker-compose.yml validates, mounts only files that exist, and agrees with the Prometheus and Grafana configs.

No Docker engine is needed: `docker-compose config` validates offline; the rest reads the YAML files.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import yaml

from tests._repo import ROOT
from tests.conftest import require_tool

COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS = ROOT / "dashboards" / "prometheus" / "prometheus.yml"
DATASOURCES = ROOT / "dashboards" / "grafana" / "provisioning" / "datasources" / "datasources.yml"
PROVIDERS = ROOT / "dashboards" / "grafana" / "provisioning" / "dashboards" / "dashboards.yml"
SHM_DIR = "/dev/shm/gatherwise"
SECRETS = ("GATHERWISE_API_TOKEN", "GRAFANA_ADMIN_PASSWORD")  # what a user exports before `up`


def services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def host_path(service: dict, container_path: str) -> Path:
    """The repository file behind `container_path` through the service's bind mounts."""
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith(".") and (container_path == target or container_path.startswith(target + "/")):
            return ROOT / source / container_path[len(target) :].lstrip("/")
    raise AssertionError(f"{container_path} is not bind-mounted from the repository")


def container_ports(service: dict) -> set[int]:
    published = {int(str(p).rsplit(":", 1)[-1]) for p in service.get("ports", [])}
    return published | {int(p) for p in service.get("expose", [])}


def flag(service: dict, name: str) -> str:
    command = service["command"]
    for i, arg in enumerate(command):
        if arg == name:
            return command[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} missing from {command}")


def compose_config(*, exported: dict[str, str]) -> subprocess.CompletedProcess:
    """`docker-compose config` as a user runs it with exactly `exported` of the stack's secrets in the environment."""
    binary = require_tool("docker-compose")
    env = {k: v for k, v in os.environ.items() if k not in SECRETS} | exported
    return subprocess.run([binary, "-f", str(COMPOSE), "config"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


def test_docker_compose_config_validates():
    result = compose_config(exported={"GRAFANA_ADMIN_PASSWORD": "a-password", "GATHERWISE_API_TOKEN": "a-token"})
    assert result.returncode == 0, result.stderr


def test_without_an_exported_token_the_sidecar_refuses_mutations():
    """No well-known token: unexported, the sidecar's token is empty, which it reads as none (mutations get 403)."""
    from gatherwise.sidecar.control.control_api import api_token

    result = compose_config(exported={"GRAFANA_ADMIN_PASSWORD": "a-password"})
    assert result.returncode == 0, result.stderr
    token = yaml.safe_load(result.stdout)["services"]["sidecar"]["environment"]["GATHERWISE_API_TOKEN"]
    assert token == ""
    assert api_token(None, {"GATHERWISE_API_TOKEN": token}) is None


def test_without_a_grafana_password_the_stack_refuses_to_start():
    result = compose_config(exported={"GATHERWISE_API_TOKEN": "a-token"})
    assert result.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in result.stderr, result.stderr


def test_no_secret_has_a_fallback_value():
    """A `${VAR:-value}` fallback for a token or password is a secret everyone knows; checked without docker-compose."""
    for name, service in services().items():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"TOKEN|PASSWORD", key):
                assert not re.search(r"\$\{\w+:?-[^}]", str(value)), f"{name}: {key} falls back to a value: {value}"


def test_every_mounted_file_and_build_input_exists():
    for name, service in services().items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
        if "build" in service:
            dockerfile = ROOT / service["build"]["context"] / service["build"]["dockerfile"]
            for line in dockerfile.read_text().splitlines():
                if line.startswith("COPY "):
                    for source in line.split()[1:-1]:
                        assert (ROOT / source).exists(), f"{dockerfile.name} copies missing {source}"


def test_images_pinned_and_every_service_has_a_healthcheck():
    for name, service in services().items():
        assert "healthcheck" in service, f"{name} has no healthcheck"
        if "build" not in service:
            assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", service["image"]), f"{name}: unpinned {service['image']}"
    assert services()["grafana"]["image"].startswith("grafana/grafana:11.6."), "dashboards target Grafana 11.6"
    stages: set[str] = set()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            _, base, _, stage = line.split()
            assert base in stages or re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*", base), f"unpinned base {base}"
            stages.add(stage)


def test_prometheus_scrapes_the_sidecar_on_its_port_with_exemplars():
    svc = services()
    (job,) = yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]
    assert job["job_name"] == "gatherwise-sidecar"
    (target,) = job["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host in svc and port == flag(svc[host], "--port") and int(port) in container_ports(svc[host])
    assert "--enable-feature=exemplar-storage" in svc["prometheus"]["command"]
    assert host_path(svc["prometheus"], flag(svc["prometheus"], "--config.file")) == PROMETHEUS


def test_grafana_datasources_point_at_compose_services():
    svc = services()
    sources = {s["type"]: s for s in yaml.safe_load(DATASOURCES.read_text())["datasources"]}
    prometheus, jaeger = urlparse(sources["prometheus"]["url"]), urlparse(sources["jaeger"]["url"])
    assert prometheus.hostname in svc and jaeger.hostname in svc
    assert flag(svc["prometheus"], "--web.listen-address").endswith(f":{prometheus.port}")
    assert prometheus.port in container_ports(svc["prometheus"]) and jaeger.port in container_ports(svc["jaeger"])
    scrape_interval = yaml.safe_load(PROMETHEUS.read_text())["global"]["scrape_interval"]
    assert sources["prometheus"]["jsonData"]["timeInterval"] == scrape_interval


def test_sidecar_exports_traces_to_jaeger_otlp():
    svc = services()
    endpoint = urlparse(svc["sidecar"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert endpoint.hostname == "jaeger" and endpoint.port == 4318 and 4318 in container_ports(svc["jaeger"])


def test_grafana_provisioning_and_home_dashboard_are_mounted():
    grafana = services()["grafana"]
    assert host_path(grafana, "/etc/grafana/provisioning/datasources") == DATASOURCES.parent
    (provider,) = yaml.safe_load(PROVIDERS.read_text())["providers"]
    dashboards = host_path(grafana, provider["options"]["path"])
    assert list(dashboards.glob("*.json")), f"no dashboards in {dashboards}"
    assert host_path(grafana, grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]).is_file()
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


def test_engine_and_sidecar_share_the_tmpfs_shm_volume():
    compose = yaml.safe_load(COMPOSE.read_text())
    assert compose["volumes"]["gatherwise-shm"]["driver_opts"]["type"] == "tmpfs"
    for name in ("engine", "engine-gpu", "sidecar"):
        service = compose["services"][name]
        assert f"gatherwise-shm:{SHM_DIR}" in service["volumes"], name
        assert flag(service, "--shm-dir") == SHM_DIR, name
    assert compose["services"]["engine-gpu"]["profiles"] == ["gpu"]
