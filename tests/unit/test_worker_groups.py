"""`meshserve up`'s worker groups: --worker-group's KEY=VALUE settings and a --fleet file become
groups on top of `up`'s own worker flags; without either, the one group is today's; a setting that
is unknown or not of its kind is refused naming it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshserve.commands import launcher
from meshserve.commands.cli import build_parser
from meshserve.commands.launcher import MeshSpec, WorkerGroup
from meshserve.services.config import WorkerConfig


def spec(*argv: str) -> MeshSpec:
    return launcher.spec_from_args(build_parser().parse_args(["up", *argv]))


def test_without_groups_the_mesh_is_one_group_of_the_workers_flags() -> None:
    mesh = spec("--engine", "sim", "--workers", "3", "--max-model-len", "1024")
    assert mesh.groups == []
    [group] = mesh.worker_groups()
    assert group.workers == 3 and group.worker == dataclasses.replace(mesh.worker, engine="sim")
    assert group.worker.max_model_len == 1024 and mesh.num_workers() == 3


def test_each_worker_group_sets_its_own_and_takes_the_rest_from_ups_flags() -> None:
    mesh = spec("--engine", "sim", "--max-num-seqs", "8",
                "--worker-group", "model=a workers=2",
                "--worker-group", "model=b engine=vllm tensor-parallel-size=2 enable-lora=true "
                                  "lora-modules=x=/p/x,y=/p/y served_model_name=bee")
    a, b = mesh.worker_groups()
    assert (a.workers, a.worker.model, a.worker.engine, a.worker.max_num_seqs) == (2, "a", "sim", 8)
    assert (b.workers, b.worker.model, b.worker.engine, b.worker.tensor_parallel_size) == (1, "b", "vllm", 2)
    assert b.worker.enable_lora and b.worker.adapters() == {"x": "/p/x", "y": "/p/y"}
    assert b.worker.served_name() == "bee" and b.worker.max_num_seqs == 8
    assert mesh.num_workers() == 3


def test_a_fleet_file_holds_the_groups_before_the_flags_ones(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("worker_groups:\n"
                     "  - {model: meshserve-tiny, workers: 2}\n"
                     "  - model: meshserve-tiny-2\n"
                     "    enable_lora: true\n"
                     "    lora-modules: [support=/adapters/support]\n"
                     "    max_loras: 2\n")
    mesh = spec("--fleet", str(fleet), "--worker-group", "engine=sim model=s")
    groups = mesh.worker_groups()
    assert [(g.workers, g.worker.model, g.worker.engine) for g in groups] == [
        (2, "meshserve-tiny", "vllm"), (1, "meshserve-tiny-2", "vllm"), (1, "s", "sim")]
    assert groups[1].worker.adapters() == {"support": "/adapters/support"} and groups[1].worker.max_loras == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["--worker-group", "model=a colour=red"], "a worker group has no setting 'colour'"),
    (["--worker-group", "model=a workers=two"], "worker group setting 'workers' takes an int, not 'two'"),
    (["--worker-group", "workers=0"], "workers must be at least 1, got 0"),
    (["--worker-group", "enable-lora=maybe"], "setting 'enable_lora' takes true or false, not 'maybe'"),
    (["--worker-group", "model a"], "takes space-separated KEY=VALUE settings, not 'model a'"),
    (["--worker-group", "lora-modules=x"], "--lora-modules takes name=path entries, not 'x'"),
    (["--worker-group", "port=1"], "a worker group has no setting 'port'"),
    (["--workers", "2", "--worker-group", "model=a"], "give each group its workers=N instead"),
])
def test_a_bad_group_is_refused_naming_what_is_wrong(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        spec(*argv)


def test_a_fleet_file_without_a_list_of_groups_is_refused(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("groups: []\n")
    with pytest.raises(ValueError, match="holds `worker_groups`, a list"):
        spec("--fleet", str(fleet))


@pytest.mark.parametrize(("worker", "served", "default"), [
    (WorkerConfig(model="/models/x"), ["/models/x", "/models/x"], "meshserve-tiny"),  # as the gateway names it
    (WorkerConfig(model="/models/x", served_model_name="x"), ["x"], "x"),  # as asked
    (WorkerConfig(model="meshserve-tiny-2"), ["meshserve-tiny-2"], "meshserve-tiny-2"),  # a tiny model's own
    (WorkerConfig(model="b"), ["b", "a"], "b"),  # several: the first group's
])
def test_the_gateways_default_model(tmp_path: Path, worker: WorkerConfig, served: list[str], default: str) -> None:
    mesh = launcher.Mesh(MeshSpec(run_dir=tmp_path, groups=[WorkerGroup(len(served), worker)]))
    mesh.worker_models = served
    assert mesh.default_model == default
