"""The Helm chart (deploy/helm/meshserve), rendered by Helm's own engine (its Go SDK) and by the
real helm binary, for the default values (with API keys: the chart refuses to render without),
the 4-GPU tensor-parallel profile and the router embedded in the gateways: every object
validates against the Kubernetes schemas (kubernetes-validate; KEDA's ScaledObject against the
schema of its CRD, from the @kubernetes-models/keda package), values are checked by the chart's
values.schema.json, the NetworkPolicies admit exactly the calls the services make, and the
invariants that break real deployments hold."""

from __future__ import annotations

import base64
import copy
import dataclasses
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python as helm
import kubernetes_validate
import pytest
import trustme
import yaml

from meshserve.commands import cli
from meshserve.deploy import envoy_config as envoy
from meshserve.services import config
from meshserve.services.config import EnvoyConfig, GatewayConfig
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


def _env(objects: list[dict[str, Any]], container: dict[str, Any], name: str) -> str | None:
    """The value the container's variable ``name`` takes, read from its Secret where it names one."""
    for var in container.get("env", []):
        if var["name"] == name:
            if "value" in var:
                return var["value"]
            ref = var["valueFrom"]["secretKeyRef"]
            return _named(objects, "Secret", ref["name"])["stringData"][ref["key"]]
    return None


def test_lint_passes_in_strict_mode() -> None:
    for values in chart.PROFILES.values():
        report = helm.lint(chart.CHART, values, strict=True, kube_version=f"v{KUBERNETES_VERSION}")
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
            "StatefulSet", "Role", "RoleBinding", "ServiceAccount", "Secret", "NetworkPolicy"} <= kinds


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
    # The Redis URL, password and all, reaches the cache and the gateways from a Secret.
    for component in ("cache", "gateway"):
        url = urlsplit(_env(objects, containers[_name(component)], config.REDIS_URL_ENV))
        where = (url.hostname, url.port, url.path)
        assert where == (_name("redis"), port_of(_name("redis")), "/0"), component
        assert "--redis-url" not in _args(containers[_name(component)])
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
    # The edge's certificate where the pod mounts it: here, the Secret the chart made, on disk.
    cfg = dataclasses.replace(envoy.settings(EnvoyConfig(), settings),
                              mesh_tls_dir=str(_secret_files(objects, "edge", tmp_path)))
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


def _secret_files(objects: list[dict[str, Any]], component: str, under: Path) -> Path:
    """A mesh TLS Secret the chart made, as its pod's mounted directory."""
    secret = _named(objects, "Secret", _name(f"mesh-tls-{component}"))
    directory = under / component
    directory.mkdir()
    for key, value in secret["data"].items():
        (directory / key).write_bytes(base64.b64decode(value))
    return directory


def _mounted_dir(pod: dict[str, Any], flag_value: str) -> str:
    """The Secret mounted at ``flag_value``, in ``pod``."""
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == flag_value]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return volume["secret"]["secretName"]


MESH_TLS_COMPONENTS = ("gateway", "router", "cache", "worker")


def test_every_service_serves_mutual_tls_with_the_secret_it_mounts(objects: list[dict[str, Any]]) -> None:
    """Each service's --mesh-tls-dir is where its own Secret is mounted, its probes present it, and
    Envoy's settings name the edge's Secret."""
    embedded = not any(o["metadata"]["name"] == _name("router") for o in _of(objects, "Deployment"))
    for component in [c for c in MESH_TLS_COMPONENTS if not (embedded and c == "router")]:
        (pod,) = [o["spec"]["template"]["spec"] for o in objects if o["kind"] in WORKLOADS
                  and o["metadata"]["name"] == _name(component)]
        container = pod["containers"][0]
        directory = _flag(_args(container), "--mesh-tls-dir")
        assert _mounted_dir(pod, directory) == _name(f"mesh-tls-{component}"), component
        probe = container["readinessProbe"]["exec"]["command"]
        assert probe[:2] == ["meshserve", "health"] and _flag(probe, "--mesh-tls-dir") == directory
        assert _flag(probe, "--peer") == config.SERVICE_IDENTITIES[component]
    settings = yaml.safe_load(_named(objects, "ConfigMap", _name("envoy"))["data"]["envoy-settings.yaml"])
    envoy_pod = _named(objects, "Deployment", _name("envoy"))["spec"]["template"]["spec"]
    assert _mounted_dir(envoy_pod, settings["mesh_tls_dir"]) == _name("mesh-tls-edge")


@pytest.mark.parametrize("caller, tenant_believed", [("edge", True), ("worker", False)])
async def test_the_charts_certificates_make_a_mutual_tls_mesh(
    tmp_path: Path, caller: str, tenant_believed: bool
) -> None:
    """The Secrets the chart makes: a gateway serving with its own presents what a caller checks
    for (its identity, the mesh CA), and reads who called: the edge's may name a tenant, another
    service's may not."""
    import grpc

    from meshserve.gateway.server import TenantOf
    from meshserve.services.mesh_tls import MeshTls, channel
    from meshserve.services.server import start

    objects = chart.render({"apiKeys": chart.API_KEYS})
    gateway_dir = _secret_files(objects, "gateway", tmp_path)
    seen: list[str | grpc.StatusCode] = []
    tenant_of = TenantOf(mutual_tls=True)

    class Echo(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
            async def tenant(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                return (await tenant_of(context)).encode()

            return grpc.unary_unary_rpc_method_handler(tenant)

    def register(server: grpc.aio.Server) -> list[str]:
        server.add_generic_rpc_handlers([Echo()])
        return []

    running = await start("gateway", config.ServerConfig(port=0, metrics_port=-1, grace_seconds=0,
                                                         mesh_tls_dir=str(gateway_dir)), register)
    try:
        tls = MeshTls.load(_secret_files(objects, caller, tmp_path))
        async with channel(f"127.0.0.1:{running.port}", tls, config.SERVICE_IDENTITIES["gateway"]) as ch:
            call = ch.unary_unary("/meshserve.v1.Inference/Tenant")
            try:
                seen.append((await call(b"", metadata=(("x-meshserve-tenant", "team-a"),), timeout=10)).decode())
            except grpc.aio.AioRpcError as e:
                seen.append(e.code())
    finally:
        await running.shutdown()
    assert seen == (["team-a"] if tenant_believed else [grpc.StatusCode.PERMISSION_DENIED])


def test_cert_manager_issues_the_mesh_certificates_when_asked() -> None:
    issuer = {"name": "mesh-ca", "kind": "ClusterIssuer"}
    objects = chart.render({"apiKeys": chart.API_KEYS, "meshTls": {"certManager": {"issuerRef": issuer}}})
    assert not [o for o in _of(objects, "Secret") if "mesh-tls" in o["metadata"]["name"]]
    certificates = {o["spec"]["secretName"]: o["spec"] for o in _of(objects, "Certificate")}
    assert set(certificates) == {_name(f"mesh-tls-{c}") for c in ("edge", *MESH_TLS_COMPONENTS)}
    edge = certificates[_name("mesh-tls-edge")]
    assert (edge["commonName"], edge["dnsNames"], edge["issuerRef"]) == (config.EDGE_IDENTITY, [config.EDGE_IDENTITY],
                                                                          issuer)
    assert {"server auth", "client auth"} <= set(edge["usages"])


def test_mesh_tls_off_leaves_the_probes_to_kubernetes_grpc() -> None:
    objects = chart.render({"apiKeys": chart.API_KEYS, "meshTls": {"enabled": False}})
    assert not [o for o in objects if "mesh-tls" in o["metadata"]["name"]]
    for component in MESH_TLS_COMPONENTS:
        (pod,) = [o["spec"]["template"]["spec"] for o in objects if o["kind"] in WORKLOADS
                  and o["metadata"]["name"] == _name(component)]
        assert "--mesh-tls-dir" not in _args(pod["containers"][0]) and "grpc" in pod["containers"][0]["readinessProbe"]
    settings = yaml.safe_load(_named(objects, "ConfigMap", _name("envoy"))["data"]["envoy-settings.yaml"])
    assert "mesh_tls_dir" not in settings


def test_envoy_serves_tls_from_the_secret_it_mounts(tmp_path: Path) -> None:
    """envoy.tls.secretName: the settings name files where the pod mounts that Secret, and Envoy
    accepts the config they make (the Secret's files stood in for by a CA the test makes)."""
    objects = chart.render({"apiKeys": chart.API_KEYS,
                            "envoy": {"tls": {"secretName": "edge-tls", "requireClientCertificate": True}}})
    settings = yaml.safe_load(_named(objects, "ConfigMap", _name("envoy"))["data"]["envoy-settings.yaml"])
    pod = _named(objects, "Deployment", _name("envoy"))["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "edge-tls"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    files = {settings[f"tls_{k}"] for k in ("cert", "key", "client_ca")}
    assert files == {f"{mount['mountPath']}/{name}" for name in ("tls.crt", "tls.key", "ca.crt")}
    ca = trustme.CA()
    server = ca.issue_cert("meshserve.example")
    server.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    server.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    local = {k: str(tmp_path / Path(v).name) if k.startswith("tls_") else v for k, v in settings.items()}
    local["mesh_tls_dir"] = str(_secret_files(objects, "edge", tmp_path))
    (tmp_path / "settings.yaml").write_text(yaml.safe_dump(local))
    cfg = envoy.settings(EnvoyConfig(), tmp_path / "settings.yaml")
    envoy.validate(envoy.write_config(cfg, tmp_path / "envoy.yaml", api_keys={}))


def test_envoys_overload_manager_acts_below_its_memory_limit(objects: list[dict[str, Any]]) -> None:
    """Envoy stops taking requests (its overload manager, on its heap) before the kernel kills it
    at the container's memory limit."""
    settings = yaml.safe_load(_named(objects, "ConfigMap", _name("envoy"))["data"]["envoy-settings.yaml"])
    container = _named(objects, "Deployment", _name("envoy"))["spec"]["template"]["spec"]["containers"][0]
    limit = container["resources"]["limits"]["memory"]
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    limit_bytes = int(limit[:-2]) * units[limit[-2:]]
    heap = settings.get("max_heap_bytes", EnvoyConfig.max_heap_bytes)
    assert heap <= 0.8 * limit_bytes, (heap, limit)


def test_client_certificates_need_the_tls_secret() -> None:
    with pytest.raises(Exception, match="requireClientCertificate needs envoy.tls.secretName"):
        chart.render({"apiKeys": chart.API_KEYS, "envoy": {"tls": {"requireClientCertificate": True}}})


def test_draining_fits_in_the_grace_period(objects: list[dict[str, Any]]) -> None:
    for w, c in _containers(objects):
        if "--grace-seconds" in c.get("args", []):
            assert w["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > float(_flag(c["args"], "--grace-seconds"))


@pytest.mark.parametrize(("gateway", "share"), [
    ({"autoscaling": {"enabled": False}, "replicas": 4}, 0.25),
    ({"autoscaling": {"enabled": True, "minReplicas": 2}, "replicas": 4}, 0.5),
    ({"flowControl": {"enabled": False}}, None),
])
def test_each_gateway_queues_for_its_share_of_the_fleet(gateway: dict[str, Any], share: float | None) -> None:
    """Flow control is on by default; each gateway keeps busy 1/N of the fleet's sequences, N the
    gateways there are (at least: the autoscaler's minimum)."""
    objects = chart.render({"apiKeys": chart.API_KEYS, "gateway": gateway})
    parsed = config.from_args(GatewayConfig, cli.build_parser().parse_args(
        _args(_named(objects, "Deployment", _name("gateway"))["spec"]["template"]["spec"]["containers"][0])))
    assert parsed.flow_control == ("off" if share is None else "on")
    if share is not None:
        assert parsed.flow_fleet_share == pytest.approx(share)


def test_tensor_parallel_workers_get_their_gpus_and_shared_memory() -> None:
    for values, tp in ((chart.PROFILES["default"], 1), (chart.PROFILES["gpu-tp4"], 4)):
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


def test_keda_scales_workers_on_waiting_requests_without_scale_to_zero(objects: list[dict[str, Any]]) -> None:
    (scaled,) = _of(objects, "ScaledObject")
    assert scaled["spec"]["minReplicaCount"] >= 1 and "idleReplicaCount" not in scaled["spec"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == _name("worker")
    assert chart.keda_metrics(objects) == {"vllm:num_requests_waiting"}  # checked against a live worker in test_mesh_vllm
    # KEDA owns the worker count: the Deployment leaves replicas to it.
    assert "replicas" not in _named(objects, "Deployment", _name("worker"))["spec"]


def test_an_external_redis_replaces_the_bundled_one() -> None:
    objects = chart.render({**chart.PROFILES["default"], "redis": {"url": "redis://:pw@redis.example:6379/2"}})
    assert not _of(objects, "StatefulSet")
    cache = next(c for w, c in _containers(objects) if w["metadata"]["name"] == _name("cache"))
    assert _env(objects, cache, config.REDIS_URL_ENV) == "redis://:pw@redis.example:6379/2"
    assert set(_named(objects, "Secret", _name("redis"))["stringData"]) == {"url"}


# --- What the chart refuses, by Helm's SDK and by the helm binary alike ----------------------

KEY = next(iter(chart.API_KEYS["keys"]))
SHORT_KEY = "sk-short-0123456789"  # 19 characters


def _with(**values: Any) -> dict[str, Any]:
    """The default profile (API keys) with ``values`` replacing its top-level keys."""
    return {**chart.PROFILES["default"], **values}


REFUSALS = [  # (id, values, what the message says)
    ("no-api-keys", {},
     ("API keys are required: set apiKeys.keys (KEY: TENANT, each key at least 32 characters) or "
      "apiKeys.existingSecret (a Secret you made), or set allowAnonymous=true")),
    ("short-key", _with(apiKeys={"keys": {SHORT_KEY: "team-a"}}),
     'the key of tenant "team-a" has 19 characters; a key needs at least 32'),
    ("separator-in-key", _with(apiKeys={"keys": {KEY + ",x": "team-a"}}),
     "the key of tenant \"team-a\" holds a space, ',', '=' or '#'"),
    ("bad-tenant", _with(apiKeys={"keys": {KEY: "team a"}}), 'tenant "team a" must be 1 to 64 letters'),
    ("keys-and-secret", _with(apiKeys={"keys": chart.API_KEYS["keys"], "existingSecret": "mine"}),
     "apiKeys.keys and apiKeys.existingSecret are both set"),
    ("short-redis-password", _with(redis={"bundled": {"password": "hunter2"}}),
     "redis.bundled.password must be at least 16 characters"),
    ("wrong-type", _with(gateway={"replicas": "two"}),
     "at '/gateway/replicas': got string, want integer"),
    ("misspelt-key", _with(gateway={"replica": 2}),
     "at '/gateway': additional properties 'replica' not allowed"),
    ("global-tolerations", _with(tolerations=[]), "additional properties 'tolerations' not allowed"),
    ("unknown-router-mode", _with(router={"mode": "sidecar"}),
     "at '/router/mode': value must be one of 'service', 'embedded'"),
    ("unknown-routing", _with(router={"routing": "fastest"}), "at '/router/routing': value must be one of"),
    ("too-few-gpus", _with(worker={"flavor": "gpu", "tensorParallelSize": 4, "gpus": 2}),
     "worker.gpus (2) must be at least worker.tensorParallelSize (4)"),
    ("group-too-few-gpus", _with(workerGroups=[{"name": "big", "flavor": "gpu", "tensorParallelSize": 4, "gpus": 2}]),
     "workerGroups[big].gpus (2) must be at least workerGroups[big].tensorParallelSize (4)"),
    ("group-names-twice", _with(workerGroups=[{"name": "a"}, {"name": "a"}]),
     "workerGroups: each group needs a name of its own, got a, a"),
    ("group-without-name", _with(workerGroups=[{"replicas": 2}]), "at '/workerGroups/0': missing property 'name'"),
    ("group-bad-name", _with(workerGroups=[{"name": "Big_Model"}]), "at '/workerGroups/0/name'"),
    ("group-misspelt-key", _with(workerGroups=[{"name": "a", "replica": 2}]),
     "at '/workerGroups/0': additional properties 'replica' not allowed"),
]


@pytest.mark.parametrize("values,message", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_the_chart_refuses_with_a_message_naming_what_to_set(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError) as refused:
        chart.render(values)
    result = chart.template(values)
    assert result.returncode == 1 and "Error: " in result.stderr, result.stderr
    for text in (str(refused.value), result.stderr):
        assert message in " ".join(text.split()), text
        assert SHORT_KEY not in text and KEY not in text  # a key is never shown


# --- API keys ----------------------------------------------------------------------------------

def _envoy(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Envoy's pod template and its container."""
    template = _named(objects, "Deployment", _name("envoy"))["spec"]["template"]
    return template, template["spec"]["containers"][0]


def test_api_keys_reach_envoy_from_a_secret_in_the_form_envoy_reads() -> None:
    keys = {"sk-team-a-" + "a" * 32: "team-a", "sk-team-b-" + "b" * 32: "team-b"}
    objects = chart.render(_with(apiKeys={"keys": keys}))
    _, container = _envoy(objects)
    secret = _named(objects, "Secret", _name("api-keys"))
    (env,) = container["env"]
    assert env["name"] == envoy.API_KEYS_ENV
    assert env["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    # Envoy's own loader reads the Secret's value back into the same keys and tenants.
    environ = {envoy.API_KEYS_ENV: _env(objects, container, envoy.API_KEYS_ENV)}
    assert envoy.load_api_keys(EnvoyConfig(), environ) == keys
    for obj in objects:
        if obj is not secret:
            assert not any(k in json.dumps(obj) for k in keys), obj["metadata"]["name"]


def test_an_existing_secret_is_read_and_none_is_made() -> None:
    objects = chart.render(_with(apiKeys={"existingSecret": "edge-keys", "secretKey": "keys"}))
    assert _name("api-keys") not in [s["metadata"]["name"] for s in _of(objects, "Secret")]
    (env,) = _envoy(objects)[1]["env"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "edge-keys", "key": "keys"}


def test_anonymous_serving_must_be_asked_for() -> None:
    objects = chart.render({"allowAnonymous": True})
    template, container = _envoy(objects)
    assert "env" not in container and "checksum/api-keys" not in template["metadata"]["annotations"]
    assert _name("api-keys") not in [s["metadata"]["name"] for s in _of(objects, "Secret")]


OTHER_KEY = "sk-chart-test-fedcba9876543210fedc"
SECRET = {"existingSecret": "keys"}
ROLLS = [  # (id, before, after, whether Envoy's pods roll)
    ("new-key", _with(), _with(apiKeys={"keys": {OTHER_KEY: "team-a"}}), True),
    ("new-tenant", _with(), _with(apiKeys={"keys": {KEY: "team-b"}}), True),
    ("another-secret", _with(apiKeys=SECRET), _with(apiKeys={"existingSecret": "keys-2"}), True),
    ("rollout-token", _with(apiKeys=SECRET), _with(apiKeys={**SECRET, "rolloutToken": "2026-12-07"}), True),
    ("unrelated-value", _with(), _with(gateway={"maxInFlight": 1024}), False),
]


@pytest.mark.parametrize("before,after,rolls", [r[1:] for r in ROLLS], ids=[r[0] for r in ROLLS])
def test_changed_keys_roll_envoy(before: dict[str, Any], after: dict[str, Any], rolls: bool) -> None:
    """Envoy reads its keys once, at start: new keys must change its pod template."""
    first, second = (_envoy(chart.render(values))[0]["metadata"]["annotations"]["checksum/api-keys"]
                     for values in (before, after))
    assert (first != second) == rolls


# --- The bundled Valkey's password -------------------------------------------------------------

def _pod_annotations(objects: list[dict[str, Any]], kind: str, component: str) -> dict[str, str]:
    return _named(objects, kind, _name(component))["spec"]["template"]["metadata"]["annotations"]


@pytest.mark.parametrize("password", ["", "a-given-password-0123"], ids=["generated", "given"])
def test_valkey_is_protected_by_a_password_no_command_line_shows(password: str) -> None:
    objects = chart.render(_with(redis={"bundled": {"password": password}}))
    secret = _named(objects, "Secret", _name("redis"))["stringData"]
    generated = secret["password"]
    assert generated == password if password else re.fullmatch(r"[A-Za-z0-9]{32}", generated)
    assert secret["valkey.conf"] == f"requirepass {generated}\n"
    assert urlsplit(secret["url"]).password == generated
    pod = _named(objects, "StatefulSet", _name("redis"))["spec"]["template"]["spec"]
    (valkey,) = pod["containers"]
    args = valkey["args"]
    assert _flag(args, "--protected-mode") == "yes"
    # Valkey reads the password from the Secret's config line, mounted as its config file.
    (mount,) = [m for m in valkey["volumeMounts"] if m["name"] == "auth"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "auth"]
    assert volume["secret"]["secretName"] == _name("redis")
    (item,) = volume["secret"]["items"]
    assert args[0] == f"{mount['mountPath']}/{item['path']}" and item["key"] == "valkey.conf"
    for w, c in _containers(objects):
        command_line = json.dumps([c.get("command"), c.get("args"), c.get("env")])
        assert generated not in command_line, w["metadata"]["name"]
    # The clients' pods carry the same checksum of the URL: one password, wherever it is read.
    clients = {_pod_annotations(objects, "Deployment", c)["checksum/redis"] for c in ("cache", "gateway")}
    assert len(clients) == 1


def test_a_new_password_rolls_valkey_and_its_clients() -> None:
    """Valkey reads its config, and the cache and the gateways their URL, at start."""
    def checksums(password: str) -> list[str]:
        objects = chart.render(_with(redis={"bundled": {"password": password}}))
        return [_pod_annotations(objects, "StatefulSet", "redis")["checksum/password"],
                *(_pod_annotations(objects, "Deployment", c)["checksum/redis"] for c in ("cache", "gateway"))]

    first, second = checksums("first-password-0123"), checksums("second-password-012")
    assert all(a != b for a, b in zip(first, second, strict=True))


# --- KEDA only where the cluster serves it -----------------------------------------------------

@pytest.mark.parametrize("api_versions,keda", [((chart.KEDA_API,), True), ((), False)],
                         ids=["keda", "no-keda"])
@pytest.mark.parametrize("renderer", ["sdk", "binary"])
def test_a_scaled_object_only_where_the_cluster_serves_kedas_api(
    renderer: str, api_versions: tuple[str, ...], keda: bool
) -> None:
    render = chart.render if renderer == "sdk" else chart.template_objects
    objects = render(_with(worker={"replicas": 3}), api_versions=api_versions)
    assert bool(_of(objects, "ScaledObject")) == keda
    worker = _named(objects, "Deployment", _name("worker"))["spec"]
    assert worker.get("replicas") == (None if keda else 3)  # without KEDA the chart's count stands


def test_no_scaled_object_when_worker_autoscaling_is_off() -> None:
    objects = chart.render(_with(autoscaling={"workers": {"enabled": False}}))
    assert not _of(objects, "ScaledObject")
    assert _named(objects, "Deployment", _name("worker"))["spec"]["replicas"] == 1


# --- Where pods run ----------------------------------------------------------------------------

SCHEDULED = {  # component -> where its values live
    "envoy": ("envoy",), "gateway": ("gateway",), "router": ("router",), "cache": ("cache",),
    "worker": ("worker",), "redis": ("redis", "bundled"), "otel-collector": ("tracing", "collector"),
}
PLACEMENT = ("nodeSelector", "tolerations", "affinity")


def _placements(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each workload's nodeSelector, tolerations and affinity (those set), by component."""
    return {w["metadata"]["labels"]["app.kubernetes.io/component"]:
            {k: v for k, v in w["spec"]["template"]["spec"].items() if k in PLACEMENT}
            for w in objects if w["kind"] in WORKLOADS}


def test_only_gpu_workers_are_placed_on_gpu_nodes() -> None:
    assert not any(_placements(chart.render(chart.PROFILES["default"])).values())
    gpu = _placements(chart.render(chart.PROFILES["gpu-tp4"]))
    assert {c for c, p in gpu.items() if p} == {"worker"}
    assert gpu["worker"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


@pytest.mark.parametrize("component", list(SCHEDULED))
def test_each_component_is_placed_by_its_own_values(component: str) -> None:
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    placement = {
        "nodeSelector": {"pool": component}, "tolerations": [{"key": "pool", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": zone}]}},
    }
    values = _with(tracing={"collector": {"enabled": True}})
    target = values
    for key in SCHEDULED[component]:
        target = target.setdefault(key, {})
    target.update(copy.deepcopy(placement))
    objects = chart.render(values)
    assert {c: p for c, p in _placements(objects).items() if p} == {component: placement}
    for obj in objects:
        if obj["kind"] in WORKLOADS:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


# --- values.schema.json ------------------------------------------------------------------------

SCHEMA = json.loads((chart.CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((chart.CHART / "values.yaml").read_text())


def _closed_objects(schema: dict[str, Any], values: Any, path: str = "") -> Iterator[tuple[str, dict, Any]]:
    """Every object the schema closes (additionalProperties: false), with the values at its path."""
    if schema.get("type") == "object" and schema.get("additionalProperties") is False:
        yield path, schema, values
        for key, sub in schema["properties"].items():
            if isinstance(values, dict) and key in values:
                yield from _closed_objects(sub, values[key], f"{path}.{key}")


def test_the_schema_describes_exactly_the_values_the_chart_has() -> None:
    """A value the schema does not know is refused (a typo fails the install): the schema must
    name every value of values.yaml, and no value values.yaml lacks."""
    seen = set()
    for path, schema, values in _closed_objects(SCHEMA, VALUES):
        if path != ".envoy.settings":  # EnvoyConfig's fields, below: values.yaml sets a few
            assert set(schema["properties"]) == set(values), path or "(top)"
        seen.add(path)
    assert {"", ".gateway.autoscaling", ".redis.bundled", ".tracing.collector", ".envoy.settings"} <= seen


def test_the_schemas_choices_are_the_services_own() -> None:
    props = SCHEMA["properties"]
    assert props["router"]["properties"]["routing"]["enum"] == list(config.ROUTING_POLICIES)
    assert props["worker"]["properties"]["engine"]["enum"] == list(config.WORKER_ENGINES)
    # envoy.settings: EnvoyConfig's fields, but those the chart sets itself (and the key file:
    # the keys come from a Secret), each with its type.
    settings = props["envoy"]["properties"]["settings"]["properties"]
    chart_set = {"listen_host", "listen_port", "stats_port", "gateways", "http_gateways",
                 "gateway_max_in_flight", "otlp_endpoint", "trace_sampling_ratio", "api_keys_file", "mesh_tls_dir"}
    json_type = {int: "integer", float: "number", str: "string"}
    hints = typing.get_type_hints(EnvoyConfig)
    fields = {f.name: json_type[hints[f.name]] for f in dataclasses.fields(EnvoyConfig)
              if f.name not in chart_set}
    assert {name: s["type"] for name, s in settings.items()} == fields


# --- NetworkPolicies ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Peer:
    """One end of a connection: a pod (its labels, its namespace) or an address outside the cluster."""

    name: str
    labels: dict[str, str] = field(default_factory=dict, hash=False)
    namespace: str | None = None
    ip: str | None = None


CLIENT = Peer("clients", {"app": "curl"}, "elsewhere")
PROMETHEUS = Peer("prometheus", {"app": "prometheus"}, "monitoring")
RESOLVER = Peer("dns", {"k8s-app": "kube-dns"}, "kube-system")
OUTSIDE = Peer("outside", ip="203.0.113.7")  # the API server, an external Redis or trace endpoint
RELEASE_LABELS = {"app.kubernetes.io/name": "meshserve", "app.kubernetes.io/instance": chart.RELEASE}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # the evaluator knows no matchExpressions
    return selector.get("matchLabels", {}).items() <= labels.items()


def _peer_matches(peer: dict[str, Any], namespace: str, other: Peer) -> bool:
    if "ipBlock" in peer:
        cidr = ipaddress.ip_network(peer["ipBlock"]["cidr"])
        return other.ip is not None and ipaddress.ip_address(other.ip) in cidr
    if other.namespace is None:
        return False
    if "namespaceSelector" in peer:
        in_namespace = _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": other.namespace})
    else:
        in_namespace = other.namespace == namespace
    return in_namespace and _selects(peer.get("podSelector", {}), other.labels)


def _admits(policies: list[dict[str, Any]], pod: Peer, other: Peer, port: int, protocol: str,
            direction: str) -> bool:
    """Whether the policies selecting ``pod`` let ``direction`` traffic with ``other`` on ``port``
    (Kubernetes' semantics: a pod no policy selects for that direction is open; else any rule of
    any policy selecting it must match)."""
    if pod.namespace != chart.NAMESPACE:
        return True  # outside the release: no policy of ours
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [p["spec"] for p in policies
                 if direction in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], pod.labels)]
    for spec in selecting:
        for rule in spec.get(key, []):
            ports = rule.get("ports", [])
            if ports and not any(p["port"] == port and p.get("protocol", "TCP") == protocol for p in ports):
                continue
            peers = rule.get(peers_key, [])
            if peers and not any(_peer_matches(p, chart.NAMESPACE, other) for p in peers):
                continue
            return True
    return not selecting


def _connects(policies: list[dict[str, Any]], src: Peer, dst: Peer, port: int, protocol: str = "TCP") -> bool:
    return (_admits(policies, src, dst, port, protocol, "Egress")
            and _admits(policies, dst, src, port, protocol, "Ingress"))


def _component(workload: dict[str, Any]) -> str:
    return workload["metadata"]["labels"]["app.kubernetes.io/component"]


def _pods(objects: list[dict[str, Any]]) -> dict[str, Peer]:
    return {_component(w): Peer(_component(w), w["spec"]["template"]["metadata"]["labels"], chart.NAMESPACE)
            for w in objects if w["kind"] in WORKLOADS}


def _calls(objects: list[dict[str, Any]]) -> set[tuple[str, str, int]]:
    """(caller, callee, port) of every call the mesh makes, read from the services' own
    configuration: their flags, environment, Envoy's settings, the collector's exporters and the
    Services' ports."""
    component_of = {w["metadata"]["name"]: _component(w) for w in objects if w["kind"] in WORKLOADS}
    (worker_port,) = [p["port"] for p in _named(objects, "Service", _name("worker"))["spec"]["ports"]]
    calls: set[tuple[str, str, int]] = set()

    def call(caller: str, address: str) -> None:
        host, _, port = address.rpartition(":")
        calls.add((caller, component_of.get(host, "outside"), int(port)))

    for w, c in _containers(objects):
        caller = component_of[w["metadata"]["name"]]
        args = _args(c)
        for flag in ("--router", "--cache", "--otlp-endpoint"):
            if flag in args and ":" in _flag(args, flag):
                call(caller, _flag(args, flag))
        redis = _env(objects, c, config.REDIS_URL_ENV)
        if redis:
            call(caller, urlsplit(redis).netloc.rpartition("@")[2])
        if caller == "gateway":  # the streams come from the workers
            calls.add((caller, "worker", worker_port))
        if "--discovery" in args:  # it finds the workers through the API server, and asks them for load
            calls |= {(caller, "worker", worker_port), (caller, "outside", 443)}
        annotations = w["spec"]["template"]["metadata"].get("annotations", {})
        if "prometheus.io/port" in annotations:
            calls.add(("prometheus", caller, int(annotations["prometheus.io/port"])))
    settings = yaml.safe_load(_named(objects, "ConfigMap", _name("envoy"))["data"]["envoy-settings.yaml"])
    for address in settings["gateways"] + settings["http_gateways"] + [settings["otlp_endpoint"]]:
        if address:
            call("envoy", address)
    collectors = [c for c in _of(objects, "ConfigMap") if c["metadata"]["name"] == _name("otel-collector")]
    for collector in collectors:
        for exporter in yaml.safe_load(collector["data"]["collector.yaml"])["exporters"].values():
            call("otel-collector", exporter["endpoint"])
    _, envoy_container = _envoy(objects)
    (port,) = [p["containerPort"] for p in envoy_container["ports"] if p["name"] == "http"]
    calls.add(("clients", "envoy", port))
    return calls


NETWORKS = {
    **chart.PROFILES,  # gpu-tp4 runs the OpenTelemetry Collector
    "external-redis": _with(redis={"url": "redis://:pw@redis.example:6380/2"}),
    "no-cache-no-http-edge": _with(gateway={"cache": False, "httpPort": 0}),
    "external-traces": _with(tracing={"otlpEndpoint": "otel.example:4318"}),
}


@pytest.mark.parametrize("values", list(NETWORKS.values()), ids=list(NETWORKS))
def test_network_policies_admit_exactly_the_calls_the_services_make(values: dict[str, Any]) -> None:
    objects = chart.render(values)
    policies, pods, calls = _of(objects, "NetworkPolicy"), _pods(objects), _calls(objects)
    assert ("gateway", "worker", 50061) in calls and ("envoy", "gateway", 50051) in calls  # the reading works
    # Every port each pod declares or is called on, from every pod of the release and from outside.
    ports = {_component(w): {p["containerPort"] for c in w["spec"]["template"]["spec"]["containers"]
                             for p in c["ports"]}
             for w in objects if w["kind"] in WORKLOADS}
    for _, callee, port in calls:
        ports.get(callee, set()).add(port)
    # Envoy's listener takes clients from anywhere (networkPolicy.ingress.from: any): a scraper too.
    (public,) = [(callee, port) for caller, callee, port in calls if caller == "clients"]
    for src in [*pods.values(), CLIENT, PROMETHEUS]:
        for dst in pods.values():
            for port in ports[dst.name]:
                from_outside = src.namespace != chart.NAMESPACE and (dst.name, port) == public
                wanted = (src.name, dst.name, port) in calls or from_outside
                assert _connects(policies, src, dst, port) == wanted, (src.name, dst.name, port)
    # Out of the cluster: only the calls above (the API server, an external Redis or trace
    # endpoint, the collector's exporters).
    for src in pods.values():
        for port in (80, 443, 4317, 4318, 6379, 6380, 9000):
            wanted = (src.name, "outside", port) in calls
            assert _admits(policies, src, OUTSIDE, port, "TCP", "Egress") == wanted, (src.name, port)
        for protocol in ("UDP", "TCP"):  # every pod resolves names
            assert _connects(policies, src, RESOLVER, 53, protocol)
    # A pod of the release that no component's policy names is shut in and out (the default deny)...
    newcomer = Peer("newcomer", {**RELEASE_LABELS, "app.kubernetes.io/component": "new"}, chart.NAMESPACE)
    assert not _connects(policies, CLIENT, newcomer, 8080) and not _connects(policies, newcomer, OUTSIDE, 443)
    # ... and the namespace's other pods see none of the release's policies.
    assert _connects(policies, CLIENT, Peer("other", {"app": "other"}, chart.NAMESPACE), 8080)


def test_envoys_callers_and_the_scrapers_are_configurable() -> None:
    def namespace(name: str) -> dict[str, Any]:
        return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}

    scraper = {"podSelector": {"matchLabels": {"app": "prometheus"}}, **namespace("observability")}
    objects = chart.render(_with(networkPolicy={"ingress": {"from": [namespace("ingress")]},
                                                "metrics": {"from": [scraper]}}))
    policies, pods = _of(objects, "NetworkPolicy"), _pods(objects)
    assert _connects(policies, Peer("ingress", {"app": "nginx"}, "ingress"), pods["envoy"], 8080)
    assert not _connects(policies, CLIENT, pods["envoy"], 8080)
    assert not _connects(policies, PROMETHEUS, pods["worker"], 9110)
    observability = Peer("prometheus", {"app": "prometheus"}, "observability")
    assert _connects(policies, observability, pods["worker"], 9110)


def test_network_policies_can_be_left_to_the_cluster() -> None:
    assert not _of(chart.render(_with(networkPolicy={"enabled": False})), "NetworkPolicy")


# --- The real helm binary ----------------------------------------------------------------------

BINARY_CONFIGS = {**NETWORKS, "anonymous": {"allowAnonymous": True},
                  "existing-secret": _with(apiKeys={"existingSecret": "edge-keys"})}


@pytest.mark.parametrize("values", list(BINARY_CONFIGS.values()), ids=list(BINARY_CONFIGS))
def test_the_helm_binary_lints_strictly_and_renders_what_the_sdk_renders(values: dict[str, Any]) -> None:
    lint = chart.run_helm("lint", "--strict", str(chart.CHART), f"--kube-version={KUBERNETES_VERSION}",
                          values=values)
    assert lint.returncode == 0 and "0 chart(s) failed" in lint.stdout, lint.stdout + lint.stderr
    rendered = chart.template_objects(values)

    def names(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return sorted((o["kind"], o["metadata"]["name"]) for o in objects)

    assert names(rendered) == names(chart.render(values))
    for obj in rendered:
        if not obj["apiVersion"].startswith("keda.sh/"):
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_lint_only_notes_a_refusal_so_the_refusals_are_checked_by_rendering() -> None:
    """Helm's lint mode turns `fail` into a note: lint passes the chart's defaults, keys or not.
    That the chart refuses is checked by rendering (test_the_chart_refuses_...)."""
    lint = chart.run_helm("lint", "--strict", str(chart.CHART), values={})
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert 'msg="funcMap fail" message="API keys are required' in lint.stderr


# --- worker groups: several base models -----------------------------------------------------------

GROUPS = _with(workerGroups=[
    {"name": "small", "model": {"servedName": "meshserve-tiny-2", "path": "meshserve-tiny-2"}, "replicas": 2,
     "lora": {"modules": ["support=/models/adapters/support"], "maxLoras": 2, "maxLoraRank": 8}},
    {"name": "big", "model": {"servedName": "llama-70b", "path": "/models/llama-70b"}, "flavor": "gpu",
     "tensorParallelSize": 4, "gpus": 4, "autoscaling": {"maxReplicas": 3}},
])


def _worker_config(container: dict[str, Any]) -> config.WorkerConfig:
    parsed = cli.build_parser().parse_args(_args(container))
    return config.from_args(config.WorkerConfig, parsed)


def test_the_default_values_serve_one_group_under_the_models_name() -> None:
    objects = chart.render(chart.PROFILES["default"])
    workers = [w for w in _of(objects, "Deployment") if w["metadata"]["name"].startswith(_name("worker"))]
    assert [w["metadata"]["name"] for w in workers] == [_name("worker")]
    assert "meshserve.io/worker-group" not in workers[0]["spec"]["selector"]["matchLabels"]
    worker = _worker_config(workers[0]["spec"]["template"]["spec"]["containers"][0])
    assert (worker.served_name(), worker.enable_lora) == ("meshserve-tiny", False)
    assert [o["metadata"]["name"] for o in _of(objects, "ScaledObject")] == [_name("worker")]


def test_each_worker_group_is_a_deployment_and_scaled_object_of_its_own_model() -> None:
    objects = chart.template_objects(GROUPS)  # the real helm binary
    for obj in objects:
        if not obj["apiVersion"].startswith("keda.sh/"):
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    result = _validate_crds(_of(objects, "ScaledObject"))
    assert result.returncode == 0, result.stdout + result.stderr
    deployments = {w["metadata"]["name"]: w for w in _of(objects, "Deployment")}
    assert _name("worker") not in deployments
    small, big = deployments[_name("worker-small")], deployments[_name("worker-big")]
    configs = {name: _worker_config(w["spec"]["template"]["spec"]["containers"][0])
               for name, w in (("small", small), ("big", big))}
    assert (configs["small"].model, configs["small"].served_name()) == ("meshserve-tiny-2", "meshserve-tiny-2")
    assert configs["small"].adapters() == {"support": "/models/adapters/support"} and configs["small"].max_loras == 2
    assert (configs["big"].served_name(), configs["big"].tensor_parallel_size, configs["big"].enable_lora) == (
        "llama-70b", 4, False)
    assert big["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert "nvidia.com/gpu" not in small["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    # Each Deployment and PodDisruptionBudget selects its own group's pods; the one headless
    # Service the router watches, every group's.
    pods = {name: w["spec"]["template"]["metadata"]["labels"] for name, w in deployments.items()}

    def selects(selector: dict[str, str]) -> set[str]:
        return {name for name, labels in pods.items() if selector.items() <= labels.items()}

    for group in ("small", "big"):
        name = _name(f"worker-{group}")
        assert selects(deployments[name]["spec"]["selector"]["matchLabels"]) == {name}
        assert selects(_named(objects, "PodDisruptionBudget", name)["spec"]["selector"]["matchLabels"]) == {name}
    assert selects(_named(objects, "Service", _name("worker"))["spec"]["selector"]) == {
        _name("worker-small"), _name("worker-big")}
    # KEDA scales each group on its own pods' waiting requests, within its own bounds.
    scaled = {o["spec"]["scaleTargetRef"]["name"]: o for o in _of(objects, "ScaledObject")}
    assert set(scaled) == {_name("worker-small"), _name("worker-big")}
    for name, obj in scaled.items():
        assert f'pod=~"{name}-.*"' in obj["spec"]["triggers"][0]["metadata"]["query"]
    assert (scaled[_name("worker-small")]["spec"]["maxReplicaCount"],
            scaled[_name("worker-big")]["spec"]["maxReplicaCount"]) == (8, 3)
    # A request naming no model runs on the first group's.
    gateway = _named(objects, "Deployment", _name("gateway"))["spec"]["template"]["spec"]["containers"][0]
    assert _flag(_args(gateway), "--model") == "meshserve-tiny-2"


def test_without_keda_each_group_runs_its_replicas() -> None:
    objects = chart.render(GROUPS, api_versions=())
    assert not _of(objects, "ScaledObject")
    assert {w["metadata"]["name"]: w["spec"]["replicas"] for w in _of(objects, "Deployment")
            if w["metadata"]["name"].startswith(_name("worker"))} == {_name("worker-small"): 2, _name("worker-big"): 1}


@pytest.mark.parametrize("lora", [{}, {"allowRuntimeUpdating": True, "registry": "/models/adapters"}])
def test_the_gateways_change_adapters_at_run_time_only_when_asked(lora: dict[str, Any]) -> None:
    """Off by default (vLLM's opt-in); asked, every gateway serves the load/unload endpoints and
    reads the registry, with flags its own parser takes."""
    objects = chart.render({"apiKeys": chart.API_KEYS, "gateway": {"lora": lora}})
    containers = {w["metadata"]["name"]: c for w, c in _containers(objects)}
    args = _args(containers[_name("gateway")])
    cfg = config.from_args(GatewayConfig, cli.build_parser().parse_args(args))
    assert cfg.allow_runtime_lora_updating == bool(lora)
    assert cfg.lora_registry == lora.get("registry", "")
