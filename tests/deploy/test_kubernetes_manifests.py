"""deploy/kubernetes/ checked offline: no cluster, no network.

- Core objects (the Service, the NetworkPolicy, the LeaderWorkerSet's two pod templates wrapped as v1 PodTemplates)
  against Kubernetes' own OpenAPI schemas, strict (an unknown field fails), as kubernetes-validate bundles them.
- The LeaderWorkerSet and the PodMonitor against small strict schemas of our own below: only the fields these
  manifests use. Their CRDs are not bundled anywhere we can read offline, and their upstream files stay out of
  this repository; a field they gain or rename upstream is not seen here.
- The plain scrape config with promtool, and the relabelings it and the PodMonitor apply against the targets
  pod discovery would make of these templates.
- What only the manifests together say: every pod has the sidecar on the engine's shm volume, the sidecar's
  args parse with the real CLI and its environment with the real config loader, the engine's node rank and
  group size agree with the LeaderWorkerSet, the controller's Service selects the leader.
- `kubectl kustomize` renders the kustomization into the same objects (kubectl's other commands, even with
  --dry-run=client, ask an API server for the resource types, so they cannot run here).
"""

from __future__ import annotations

import copy
import importlib.metadata
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gatherwise.config import load_config
from gatherwise.sidecar.api import cli as sidecar_cli
from tests._repo import ROOT
from tests.conftest import require_tool

MANIFESTS = ROOT / "deploy" / "kubernetes"
K8S_FILES = ("leaderworkerset.yaml", "service.yaml", "networkpolicy.yaml", "podmonitor.yaml")
SCRAPE_CONFIG = MANIFESTS / "prometheus-scrape.yml"
# Native sidecars (restartPolicy on an init container) are on by default from 1.29 and GA in 1.33.
K8S_VERSIONS = ("1.29", "1.33")
SIDECAR = "gatherwise-sidecar"
SHM_VOLUME = "gatherwise-shm"
JOB = "gatherwise-sidecar"  # the job dashboards/prometheus/alert_rules.yml selects
SECRET_PLACEHOLDER = "token-from-the-secret"

# --- our own subset schemas: only what these manifests use, nothing else allowed ---------------------------------
OBJECT_META = {"type": "object", "additionalProperties": False, "required": ["name"],
               "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                              "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}
LEADER_WORKER_SET = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "leaderworkerset.x-k8s.io/v1"},
        "kind": {"const": "LeaderWorkerSet"},
        "metadata": OBJECT_META,
        "spec": {"type": "object", "additionalProperties": False, "required": ["leaderWorkerTemplate"], "properties": {
            "replicas": {"type": "integer", "minimum": 0},
            "leaderWorkerTemplate": {
                "type": "object", "additionalProperties": False, "required": ["size", "workerTemplate"],
                "properties": {
                    "size": {"type": "integer", "minimum": 1},
                    "restartPolicy": {"enum": ["RecreateGroupOnPodRestart", "None", "Default"]},
                    # checked as core PodTemplateSpecs against Kubernetes' schema (test_core_objects_…)
                    "leaderTemplate": {"type": "object"},
                    "workerTemplate": {"type": "object"},
                }},
        }},
    },
}
DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$", "minLength": 1}
LABEL_NAME = {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}
POD_MONITOR = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": OBJECT_META,
        "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "podMetricsEndpoints"],
                 "properties": {
                     "selector": {"type": "object", "additionalProperties": False, "properties": {
                         "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}},
                     "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "additionalProperties": False, "required": ["port"], "properties": {
                             "port": {"type": "string"},
                             "interval": DURATION,
                             "scrapeTimeout": DURATION,
                             "relabelings": {"type": "array", "items": {
                                 "type": "object", "additionalProperties": False, "properties": {
                                     "sourceLabels": {"type": "array", "items": LABEL_NAME},
                                     "targetLabel": {"type": "string"},
                                     "replacement": {"type": "string"},
                                     "regex": {"type": "string"},
                                     "action": {"enum": ["replace", "keep", "drop", "labelmap"]},
                                 }}},
                         }}},
                 }},
    },
}
CUSTOM_SCHEMAS = {"LeaderWorkerSet": LEADER_WORKER_SET, "PodMonitor": POD_MONITOR}
# what promtool cannot check where it is built without Kubernetes discovery (Debian's): the discovery block
KUBERNETES_SD = {"type": "array", "minItems": 1, "items": {
    "type": "object", "additionalProperties": False, "required": ["role"],
    "properties": {"role": {"enum": ["node", "service", "pod", "endpoints", "endpointslice", "ingress"]}}}}


# --- loading -----------------------------------------------------------------------------------------------------
def k8s_objects() -> list[dict[str, Any]]:
    return [doc for name in K8S_FILES for doc in yaml.safe_load_all((MANIFESTS / name).read_text()) if doc]


def one(kind: str) -> dict[str, Any]:
    found = [o for o in k8s_objects() if o["kind"] == kind]
    assert len(found) == 1, f"{kind}: {len(found)} objects"
    return found[0]


def templates() -> dict[str, dict[str, Any]]:
    lwt = one("LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    return {"leader": lwt["leaderTemplate"], "worker": lwt["workerTemplate"]}


def sidecar(template: dict[str, Any]) -> dict[str, Any]:
    found = [c for c in template["spec"].get("initContainers", []) if c["name"] == SIDECAR]
    assert len(found) == 1, f"{len(found)} init containers named {SIDECAR}"
    return found[0]


def engine(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the process sees it; a value from a Secret stands in as a placeholder."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in var.get("valueFrom", {}):
            env[var["name"]] = SECRET_PLACEHOLDER
    return env


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def mount_path(container: dict[str, Any], volume: str) -> str:
    paths = [m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] == volume]
    assert len(paths) == 1, f"{container['name']} mounts {volume} {len(paths)} times"
    return paths[0]


def port_named(container: dict[str, Any], name: str) -> int:
    ports = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == name]
    assert len(ports) == 1, f"{container['name']} has {len(ports)} ports named {name}"
    return ports[0]


def as_pod_template(name: str, template: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}


# --- schemas -----------------------------------------------------------------------------------------------------
def core_objects() -> Iterator[dict[str, Any]]:
    yield from (o for o in k8s_objects() if o["kind"] not in CUSTOM_SCHEMAS)
    for role, template in templates().items():
        yield as_pod_template(f"llm-{role}", template)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_objects_match_kubernetes_schemas(version):
    checked = []
    for obj in core_objects():
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']} (Kubernetes {version}): {where}: {exc.message}")
        checked.append(obj["kind"])
    assert sorted(checked) == ["NetworkPolicy", "PodTemplate", "PodTemplate", "Service"]


def test_kubernetes_schemas_are_strict():
    """The check above can fail: a misspelt field in a pod template is refused."""
    template = copy.deepcopy(templates()["leader"])
    sidecar(template)["restartPolicyy"] = sidecar(template).pop("restartPolicy")
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicyy"):
        kubernetes_validate.validate(as_pod_template("typo", template), K8S_VERSIONS[0], strict=True)


@pytest.mark.parametrize("kind", sorted(CUSTOM_SCHEMAS))
def test_custom_resources_match_our_subset_schemas(kind):
    schema = CUSTOM_SCHEMAS[kind]
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(one(kind))
    typo = copy.deepcopy(one(kind))
    typo["spec"]["replica"] = 1
    with pytest.raises(jsonschema.ValidationError, match="replica"):
        jsonschema.Draft202012Validator(schema).validate(typo)


# --- Prometheus ----------------------------------------------------------------------------------------------------
def promtool_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([require_tool("promtool"), "check", "config", str(path)], capture_output=True, text=True,
                          timeout=120)


def test_scrape_config_passes_promtool(tmp_path):
    result = promtool_check(SCRAPE_CONFIG)
    if "field kubernetes_sd_configs not found" in result.stdout + result.stderr:
        # This promtool was built without Kubernetes discovery (Debian's is): check the rest of the file with
        # file discovery in its place, and the discovery block against the schema above.
        config = yaml.safe_load(SCRAPE_CONFIG.read_text())
        (targets := tmp_path / "targets.json").write_text("[]")
        for job in config["scrape_configs"]:
            jsonschema.validate(job.pop("kubernetes_sd_configs"), KUBERNETES_SD)
            job["file_sd_configs"] = [{"files": [str(targets)]}]
        (substitute := tmp_path / "prometheus-scrape.yml").write_text(yaml.safe_dump(config))
        result = promtool_check(substitute)
    assert result.returncode == 0, f"promtool check config:\n{result.stdout}\n{result.stderr}"


def relabel(labels: dict[str, str], rules: list[dict[str, Any]], camel: bool) -> dict[str, str] | None:
    """Prometheus' relabelling, the actions these files use (replace, keep); None: the target is dropped."""
    key = (lambda k: re.sub(r"_(\w)", lambda m: m.group(1).upper(), k)) if camel else (lambda k: k)
    labels = dict(labels)
    for rule in rules:
        value = ";".join(labels.get(s, "") for s in rule.get(key("source_labels"), []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep":
            if match is None:
                return None
        elif action == "replace":
            if match is not None:
                labels[rule[key("target_label")]] = match.expand(rule.get("replacement", "$1").replace("$", "\\"))
        else:
            raise AssertionError(f"relabel action {action} is not simulated here")
    return labels


def pod_targets(template: dict[str, Any], pod: str) -> Iterator[dict[str, str]]:
    """What Prometheus' pod discovery makes of a pod: one target per container port, init containers included."""
    for container in [*template["spec"]["containers"], *template["spec"].get("initContainers", [])]:
        for port in container.get("ports", []):
            yield {"job": JOB, "__meta_kubernetes_pod_name": pod, "__meta_kubernetes_pod_node_name": f"node-of-{pod}",
                   "__meta_kubernetes_pod_container_name": container["name"],
                   "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                   "__meta_kubernetes_pod_container_port_number": str(port["containerPort"])}


def scraped(rules: list[dict[str, Any]], camel: bool, port_name: str | None = None) -> list[dict[str, str]]:
    kept = []
    for role, template in templates().items():
        for target in pod_targets(template, f"llm-0-{role}"):
            if port_name is not None and target["__meta_kubernetes_pod_container_port_name"] != port_name:
                continue  # a PodMonitor endpoint selects its port by name before any relabelling
            if (labels := relabel(target, rules, camel)) is not None:
                kept.append(labels)
    return kept


def assert_one_target_per_sidecar(kept: list[dict[str, str]]) -> None:
    assert [(t["__meta_kubernetes_pod_container_name"], t["pod"]) for t in kept] == \
        [(SIDECAR, "llm-0-leader"), (SIDECAR, "llm-0-worker")]
    for t in kept:
        assert t["job"] == JOB and t["node"] == f"node-of-{t['pod']}"
        assert t["__meta_kubernetes_pod_container_port_number"] == "9400"


def test_scrape_config_keeps_one_target_per_sidecar():
    (job,) = yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]
    assert job["job_name"] == JOB
    assert_one_target_per_sidecar(scraped(job["relabel_configs"], camel=False))


def test_pod_monitor_scrapes_every_sidecar_as_the_rules_job():
    (endpoint,) = one("PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["interval"] == "5s"
    assert_one_target_per_sidecar(scraped(endpoint["relabelings"], camel=True, port_name=endpoint["port"]))
    assert f'up{{job="{JOB}"}}' in (ROOT / "dashboards" / "prometheus" / "alert_rules.yml").read_text()


def test_monitors_select_the_group():
    name = one("LeaderWorkerSet")["metadata"]["name"]
    group = {"leaderworkerset.sigs.k8s.io/name": name}  # the label LeaderWorkerSet puts on every pod it makes
    assert one("PodMonitor")["spec"]["selector"]["matchLabels"] == group
    assert one("NetworkPolicy")["spec"]["podSelector"]["matchLabels"] == group


# --- the layout ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("role", ["leader", "worker"])
def test_every_pod_has_the_sidecar_on_the_engines_shm(role):
    template = templates()[role]
    side = sidecar(template)
    assert side["restartPolicy"] == "Always"  # native: starts before the engine, never holds up its exit
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes[SHM_VOLUME]["emptyDir"]["medium"] == "Memory" and volumes[SHM_VOLUME]["emptyDir"]["sizeLimit"]
    for container in template["spec"]["containers"]:
        assert mount_path(container, SHM_VOLUME) == mount_path(side, SHM_VOLUME), container["name"]
    # one user for every container: the engine's shm files are 0600
    assert template["spec"]["securityContext"]["runAsUser"]
    assert all("runAsUser" not in c.get("securityContext", {})
               for c in [*template["spec"]["containers"], *template["spec"]["initContainers"]])


@pytest.mark.parametrize("role", ["leader", "worker"])
def test_sidecar_args_and_env_load_with_the_real_cli(role):
    side, eng = sidecar(templates()[role]), engine(templates()[role])
    (entry,) = [e for e in importlib.metadata.entry_points(group="gatherwise.commands") if e.name == "sidecar"]
    assert side["command"] == ["gatherwise", "sidecar"] and entry.value == "gatherwise.sidecar.api.cli:main"
    cfg = sidecar_cli.apply_overrides(load_config(env=env_of(side)), sidecar_cli.parse_args(side["args"]))
    assert cfg.sidecar.host == "0.0.0.0"  # reachable from Prometheus' pod
    assert cfg.sidecar.port == port_named(side, "gw-metrics")
    assert side["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "gw-metrics"}
    # A native sidecar's readiness is the pod's, and /readyz is 503 while the engine is idle: no such probe.
    assert "readinessProbe" not in side
    assert env_of(side)["GATHERWISE_API_TOKEN"] == SECRET_PLACEHOLDER  # from the Secret, never in the manifest
    # the engine's rings are where the sidecar reads, inside the shared volume but not its root (0777)
    engine_env = env_of(eng)
    assert engine_env["GATHERWISE_ENABLE"] == "1"
    engine_cfg = load_config(env=engine_env)
    assert engine_cfg.engine.shm_dir == cfg.engine.shm_dir
    assert Path(cfg.engine.shm_dir).parent == Path(mount_path(side, SHM_VOLUME))


def test_the_group_agrees_with_the_engines_flags():
    lwt = one("LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    for role, template in templates().items():
        args = engine(template)["args"]
        gpus = engine(template)["resources"]["limits"]["nvidia.com/gpu"]
        assert int(flag(args, "--nnodes")) == lwt["size"], role
        assert int(flag(args, "--tp")) == lwt["size"] * gpus, role
        assert flag(args, "--dist-init-addr").startswith("$(LWS_LEADER_ADDRESS):"), role
    leader, worker = (engine(t)["args"] for t in templates().values())
    assert flag(leader, "--node-rank") == "0"  # TP rank 0 and the control block: the controller's pod
    assert flag(worker, "--node-rank") == "$(LWS_WORKER_INDEX)"
    assert flag(leader, "--dist-init-addr") == flag(worker, "--dist-init-addr")


def test_worker_differs_from_leader_only_in_the_engines_role():
    leader, worker = templates()["leader"]["spec"], templates()["worker"]["spec"]
    assert leader["initContainers"] == worker["initContainers"]
    assert leader["volumes"] == worker["volumes"] and leader["securityContext"] == worker["securityContext"]
    for key in ("image", "command", "env", "volumeMounts", "resources"):
        assert engine({"spec": leader})[key] == engine({"spec": worker})[key], key


def test_leader_service_reaches_the_controller():
    service, lws = one("Service"), one("LeaderWorkerSet")
    assert service["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": lws["metadata"]["name"],
                                           "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    assert lws["spec"]["replicas"] == 1  # worker-index 0 of every group: one group, one controller
    (port,) = service["spec"]["ports"]
    assert port_named(sidecar(templates()["leader"]), port["targetPort"]) == port["port"]
    assert service["spec"]["publishNotReadyAddresses"] is True


def test_network_policy_admits_port_9400_only_from_monitoring_operators_and_the_group():
    policy = one("NetworkPolicy")["spec"]
    group = policy["podSelector"]
    assert policy["policyTypes"] == ["Ingress"]
    allowed = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}
               for ns in ("monitoring", "llm-operators")] + [{"podSelector": group}]
    opened = 0
    for rule in policy["ingress"]:
        ports = [p["port"] for p in rule.get("ports", [])]
        if ports and 9400 not in ports:
            continue
        assert rule.get("from"), f"port 9400 open to everyone: {rule}"
        assert all(peer in allowed for peer in rule["from"]), rule["from"]
        opened += 1
    assert opened == 2  # Prometheus and the operators on 9400; the group on every port


def test_kustomize_renders_the_same_objects():
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(K8S_FILES)
    assert {p.name for p in MANIFESTS.glob("*.yaml")} == {*K8S_FILES, "kustomization.yaml"}
    result = subprocess.run([require_tool("kubectl"), "kustomize", str(MANIFESTS)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, f"kubectl kustomize:\n{result.stderr}"
    key = lambda o: (o["kind"], o["metadata"]["name"])
    assert sorted(yaml.safe_load_all(result.stdout), key=key) == sorted(k8s_objects(), key=key)
