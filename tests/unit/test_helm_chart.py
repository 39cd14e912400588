"""The Helm chart (deploy/helm/meshserve), rendered by Helm's own engine for the default values,
the 4-GPU tensor-parallel profile and the router embedded in the gateways: every object
validates against the Kubernetes schemas (kubernetes-validate; KEDA's ScaledObject against the
schema of its CRD, from the @kubernetes-models/keda package), and the invariants that break real
deployments hold."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from meshserve.commands import cli
from meshserve.deploy import envoy_config as envoy
from meshserve.services import config
from meshserve.services.config import EnvoyConfig
from tests import chart

KUBERNETES_VERSION = "1.31.0"
ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / ".venv" / "node" / "node_modules"  # `make install` puts the KEDA models here
CRD_VALIDATOR = Path(__file__).with_name("validate_crds.js")
WORKLOADS = ("Deployment", "StatefulSet")


@pytest.fixture(scope="module", params=list(chart.PROFILES))
def objects(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return chart.render(chart.PROFILES[request.param])


def _of(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in _of(objects, kind) if o["metadata"]["name"] == name]
    return obj


def _name(component: str) -> str:
    return f"{chart.RELEASE}-meshserve-{component}"


def _containers(objects: list[dict[str, Any]]):  # -> Iterator[(workload, container)]
    for w in objects:
        if w["kind"] in WORKLOADS:
            for c in w["spec"]["template"]["spec"]["containers"]:
                yield w, c


def _args(container: dict[str, Any]) -> list[str]:
    """A meshserve container's command line, with the pod's env references filled in."""
    return [a.replace("$(POD_NAME)", "worker-pod-0") for a in container.get("args", [])]


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_lint_passes_in_strict_mode() -> None:
    for values in chart.PROFILES.values():
        report = helm.lint(chart.CHART, chart.values_of(values),
                           strict=True, kube_version=f"v{KUBERNETES_VERSION}")
        errors = [m for m in report["messages"] if m["severity"] >= 2]
        assert not errors and not report["errors"], report


def test_every_object_validates_against_the_kubernetes_schemas(objects: list[dict[str, Any]]) -> None:
    kinds = set()
    for obj in objects:
        if obj["apiVersion"].startswith("keda.sh/"):
            continue  # a CRD: the next test
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        kinds.add(obj["kind"])
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "HorizontalPodAutoscaler",
            "StatefulSet", "Role", "RoleBinding", "ServiceAccount"} <= kinds


def test_the_validator_refuses_what_kubernetes_refuses(objects: list[dict[str, Any]]) -> None:
    broken = json.loads(json.dumps(_named(objects, "Deployment", _name("worker"))))
    broken["spec"]["template"]["spec"]["containers"][0]["resources"]["limit"] = {}  # a misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def _validate_crds(objects: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    assert node, "node is needed to validate the KEDA ScaledObject (make install installs its models)"
    assert NODE_MODULES.is_dir(), f"{NODE_MODULES} is missing: run make install"
    return subprocess.run([node, str(CRD_VALIDATOR)], input=json.dumps(objects), capture_output=True, text=True,
                          env={**os.environ, "NODE_PATH": str(NODE_MODULES)}, timeout=60)


def test_the_scaled_object_validates_against_kedas_crd(objects: list[dict[str, Any]]) -> None:
    (scaled,) = _of(objects, "ScaledObject")
    result = _validate_crds([scaled])
    assert result.returncode == 0, result.stdout + result.stderr
    broken = json.loads(json.dumps(scaled))
    broken["spec"]["triggers"][0]["metadata"]["threshold"] = 16  # KEDA takes strings only
    result = _validate_crds([broken])
    assert result.returncode == 1 and "threshold" in result.stdout, result.stdout + result.stderr


def test_selectors_match_the_pods_they_select(objects: list[dict[str, Any]]) -> None:
    pods = {w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"]
            for w in objects if w["kind"] in WORKLOADS}

    def selects(selector: dict[str, str]) -> list[str]:
        return [name for name, labels in pods.items() if selector.items() <= labels.items()]

    for w in objects:
        if w["kind"] in WORKLOADS:
            assert selects(w["spec"]["selector"]["matchLabels"]) == [w["metadata"]["name"]]
    for obj in _of(objects, "Service") + _of(objects, "PodDisruptionBudget"):
        selector = obj["spec"]["selector"]
        assert len(selects(selector.get("matchLabels", selector))) == 1, obj["metadata"]["name"]
    for obj in _of(objects, "HorizontalPodAutoscaler") + _of(objects, "ScaledObject"):
        assert obj["spec"]["scaleTargetRef"]["name"] in pods


def test_every_container_has_requests_limits_and_probes(objects: list[dict[str, Any]]) -> None:
    for w, c in _containers(objects):
        where = f"{w['metadata']['name']}/{c['name']}"
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"].get(kind, {})), f"{where}: {kind}"
        assert "readinessProbe" in c and "livenessProbe" in c, where
        assert w["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True, where


def test_images_are_pinned(objects: list[dict[str, Any]]) -> None:
    for _, c in _containers(objects):
        name, _, tag = c["image"].rpartition(":")
        assert name and tag and tag != "latest" and "/" not in tag, c["image"]


def _embedded(objects: list[dict[str, Any]]) -> bool:
    """Whether the gateways pick themselves (router.mode: embedded)."""
    containers = {w["metadata"]["name"]: c for w, c in _containers(objects)}
    return _flag(_args(containers[_name("gateway")]), "--router") == "embedded"


def test_every_meshserve_command_line_parses(objects: list[dict[str, Any]]) -> None:
    """The args the chart writes are flags the services really take (the CLI's own parser), and
    each service's configuration accepts them (its own checks: e.g. an embedded router's discovery)."""
    parser = cli.build_parser()
    seen = set()
    for _, c in _containers(objects):
        if c["image"].startswith("ghcr.io/meshserve/") and "command" not in c:
            parsed = parser.parse_args(_args(c))
            service = getattr(parsed, "service", None)
            if service:
                config.from_args(cli.SERVICES[service][0], parsed)
            seen.add(service or parsed.command)
    router = set() if _embedded(objects) else {"router"}
    assert seen == {"gateway", "cache", "worker", "envoy-config"} | router


def test_services_find_each_other_by_the_names_and_ports_the_chart_gives(objects: list[dict[str, Any]]) -> None:
    services = {s["metadata"]["name"]: s for s in _of(objects, "Service")}

    def port_of(name: str) -> int:
        (port,) = [p["port"] for p in services[name]["spec"]["ports"]]
        return port

    containers = {w["metadata"]["name"]: c for w, c in _containers(objects)}
    gateway = _args(containers[_name("gateway")])
    if _embedded(objects):  # the gateways pick, under the account the Role below is bound to
        assert _name("router") not in services and _name("router") not in containers
        router = gateway
        pod = _named(objects, "Deployment", _name("gateway"))["spec"]["template"]["spec"]
        (binding,) = _of(objects, "RoleBinding")
        assert [s["name"] for s in binding["subjects"]] == [pod["serviceAccountName"]]
    else:
        assert _flag(gateway, "--router") == f"{_name('router')}:{port_of(_name('router'))}"
        router = _args(containers[_name("router")])
    assert _flag(gateway, "--cache") == f"{_name('cache')}:{port_of(_name('cache'))}"
    assert _flag(_args(containers[_name("cache")]), "--redis-url") == f"redis://{_name('redis')}:{port_of(_name('redis'))}/0"
    assert _flag(router, "--discovery") == "kubernetes"
    assert _flag(router, "--kubernetes-service") == _name("worker")
    worker_service = services[_name("worker")]
    assert worker_service["spec"]["clusterIP"] == "None"  # headless: one endpoint per worker pod
    assert [p["name"] for p in worker_service["spec"]["ports"]] == [_flag(router, "--kubernetes-port")]
    # Every Service's target port is a port its pods declare, and the gRPC port the process binds.
    for name, service in services.items():
        pod = containers[name]
        declared = {p["name"]: p["containerPort"] for p in pod["ports"]}
        for p in service["spec"]["ports"]:
            assert p["targetPort"] in declared, f"{name}: {p['targetPort']}"
        if pod["args"][:1] == ["serve"]:
            assert int(_flag(_args(pod), "--port")) == declared["grpc"] == port_of(name)
            assert int(_flag(_args(pod), "--metrics-port")) == declared["metrics"]
    # The router (or the gateways that pick) may watch the workers' EndpointSlices.
    (role,) = _of(objects, "Role")
    assert {"list", "watch"} <= set(role["rules"][0]["verbs"]) and role["rules"][0]["resources"] == ["endpointslices"]


def test_envoy_config_from_the_configmap_agrees_with_the_chart(objects: list[dict[str, Any]], tmp_path: Path) -> None:
    """The pod renders Envoy's config from its ConfigMap with the generator `meshserve up` uses:
    the same here, checked by Envoy itself, listening where the Service sends and sending to the
    gateways' Service."""
    configmap = _named(objects, "ConfigMap", _name("envoy"))
    settings = tmp_path / "envoy-settings.yaml"
    settings.write_text(configmap["data"]["envoy-settings.yaml"])
    cfg = envoy.settings(EnvoyConfig(), settings)
    path = envoy.write_config(cfg, tmp_path / "envoy.yaml", api_keys={})
    envoy.validate(path)
    bootstrap = envoy.build_config(cfg, api_keys={})
    listener = bootstrap["static_resources"]["listeners"][0]["address"]["socket_address"]
    deployment = _named(objects, "Deployment", _name("envoy"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    http = {"name": "http", "containerPort": ports["http"]}
    (service_port,) = _named(objects, "Service", _name("envoy"))["spec"]["ports"]
    assert listener == {"address": "0.0.0.0", "port_value": http["containerPort"]}
    stats = next(lst for lst in bootstrap["static_resources"]["listeners"] if lst["name"] == "stats")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert stats["address"]["socket_address"]["port_value"] == ports["metrics"] == int(annotations["prometheus.io/port"])
    assert annotations["prometheus.io/path"] == envoy.STATS_PATH
    assert service_port["targetPort"] == http["name"]
    assert bootstrap["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    (cluster,) = [c for c in bootstrap["static_resources"]["clusters"] if c["name"] == envoy.GATEWAY_CLUSTER]
    assert cluster["type"] == "STRICT_DNS"  # every gateway pod behind the headless Service
    (endpoint,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    gateway = _named(objects, "Service", _name("gateway"))
    assert endpoint["endpoint"]["address"]["socket_address"] == {
        "address": gateway["metadata"]["name"], "port_value": gateway["spec"]["ports"][0]["port"]}
    assert gateway["spec"]["clusterIP"] == "None"
    # Streams go to every gateway pod's HTTP edge: the port its container declares and its
    # --http-port opens.
    (http_cluster,) = [c for c in bootstrap["static_resources"]["clusters"] if c["name"] == envoy.HTTP_GATEWAY_CLUSTER]
    assert http_cluster["type"] == "STRICT_DNS"
    (http_endpoint,) = http_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    gateway_pod = _named(objects, "Deployment", _name("gateway"))["spec"]["template"]["spec"]["containers"][0]
    edge_port = {p["name"]: p["containerPort"] for p in gateway_pod["ports"]}["http-edge"]
    assert http_endpoint["endpoint"]["address"]["socket_address"] == {
        "address": gateway["metadata"]["name"], "port_value": edge_port}
    assert int(_flag(_args(gateway_pod), "--http-port")) == edge_port
    # The container's command line reads that file; its preStop drains with the same settings.
    assert _flag(_args(container), "--settings").endswith("/envoy-settings.yaml")
    prestop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert prestop[:2] == ["meshserve", "envoy-config"] and "--drain" in prestop, shlex.join(prestop)


def test_draining_fits_in_the_grace_period(objects: list[dict[str, Any]]) -> None:
    for w, c in _containers(objects):
        if "--grace-seconds" in c.get("args", []):
            assert w["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > float(_flag(c["args"], "--grace-seconds"))


def test_tensor_parallel_workers_get_their_gpus_and_shared_memory() -> None:
    for values, tp in ((None, 1), (chart.PROFILES["gpu-tp4"], 4)):
        objects = chart.render(values)
        worker = _named(objects, "Deployment", _name("worker"))
        pod = worker["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert int(_flag(_args(c), "--tensor-parallel-size")) == tp
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        if tp > 1:
            assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
            assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == tp
            assert c["image"].endswith("-gpu")
            assert _flag(_args(c), "--model").startswith("/models/") and mounts["/models"] == "model"
        else:
            assert "nvidia.com/gpu" not in c["resources"]["limits"] and c["image"].endswith("-cpu")


def test_too_few_gpus_for_the_tensor_parallel_size_is_refused() -> None:
    with pytest.raises(helm.HelmError, match="worker.gpus"):
        chart.render({"worker": {"flavor": "gpu", "tensorParallelSize": 4, "gpus": 2}})


def test_an_unknown_router_mode_is_refused_with_the_choices() -> None:
    with pytest.raises(helm.HelmError, match="router.mode must be service or embedded, not \"sidecar\""):
        chart.render({"router": {"mode": "sidecar"}})


def test_keda_scales_workers_on_waiting_requests_without_scale_to_zero(objects: list[dict[str, Any]]) -> None:
    (scaled,) = _of(objects, "ScaledObject")
    assert scaled["spec"]["minReplicaCount"] >= 1 and "idleReplicaCount" not in scaled["spec"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == _name("worker")
    assert chart.keda_metrics(objects) == {"vllm:num_requests_waiting"}  # checked against a live worker in test_mesh_vllm
    # KEDA owns the worker count: the Deployment leaves replicas to it.
    assert "replicas" not in _named(objects, "Deployment", _name("worker"))["spec"]


def test_api_keys_come_from_a_secret_never_a_configmap() -> None:
    objects = chart.render({"apiKeys": {"keys": {"sk-team-a": "team-a"}}})
    (secret,) = _of(objects, "Secret")
    assert secret["stringData"]["api-keys"] == "sk-team-a=team-a"
    container = _named(objects, "Deployment", _name("envoy"))["spec"]["template"]["spec"]["containers"][0]
    (env,) = container["env"]
    assert env["name"] == envoy.API_KEYS_ENV and env["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    assert all("sk-team-a" not in json.dumps(cm) for cm in _of(objects, "ConfigMap"))


def test_an_external_redis_replaces_the_bundled_one() -> None:
    objects = chart.render({"redis": {"url": "redis://redis.example:6379/2"}})
    assert not _of(objects, "StatefulSet")
    cache = next(c for w, c in _containers(objects) if w["metadata"]["name"] == _name("cache"))
    assert _flag(cache["args"], "--redis-url") == "redis://redis.example:6379/2"
