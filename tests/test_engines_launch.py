"""The emitted launchers start real processes on CPU: torchrun, 2 processes, gloo, a stand-in script.

* the per-node torchrun script, on one node of 2 ranks and as 2 nodes of 1 rank (two launches);
* the SLURM batch script, with no SLURM here: it runs under bash with the SLURM_* variables a
  2-node allocation sets, ``scontrol`` and ``srun`` replaced by shims on PATH (``srun`` starts its
  command once per node with SLURM_NODEID / SLURM_PROCID set, as ``--ntasks-per-node=1`` does);
* the PyTorchJob's container command, run as its Master and Worker pods would run it, with the
  variables the training operator injects (MASTER_ADDR, MASTER_PORT, RANK).

Each rank records what it got; the test compares that with the plan's rank map and the program.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from export_factory import engine_module, files_of, make_export_plan

from paraplan.exporters.formats import ExportOptions, engine_program
from paraplan.exporters.plan_input import ExportPlan

pytestmark = pytest.mark.engines
engine_module("torch.distributed.run")

STANDIN = Path(__file__).with_name("launch_standin.py")
TIMEOUT_S = 180

SRUN_SHIM = """#!/usr/bin/env bash
# srun stand-in: --nodes=N starts the command N times, once per node, with the task variables SLURM sets.
nodes=1
while [[ $# -gt 0 && "$1" == -* ]]; do
  case "$1" in --nodes=*) nodes=${1#--nodes=} ;; esac
  shift
done
pids=()
for ((i = 0; i < nodes; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 SLURM_STEP_NUM_NODES=$nodes "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""
SCONTROL_SHIM = """#!/usr/bin/env bash
# scontrol stand-in: 'show hostnames a,b' prints one host per line.
[[ "$1 $2" == "show hostnames" ]] && tr ',' '\\n' <<< "$3"
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_export(plan: ExportPlan, fmt: str, folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, f in files_of(plan, fmt).items():
        paths[name] = folder / name
        paths[name].write_text(f.text)
    return paths


def base_env(out: Path, **extra: str) -> dict[str, str]:
    """The test's environment with this interpreter's torchrun first on PATH (an activated venv)."""
    out.mkdir(parents=True, exist_ok=True)
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    return {**os.environ, "PATH": path, "TRAIN_SCRIPT": str(STANDIN), "STANDIN_OUT": str(out),
            "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1", **extra}


def records(out: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in out.glob("rank-*.json")), key=lambda r: r["rank"])


def assert_ran_the_plan(plan: ExportPlan, out: Path, config_dir: Path | None = None) -> list[dict]:
    """Every rank ran once, saw the whole world, sits where the plan's rank map puts it and got the program."""
    got = records(out)
    world = plan.num_gpus
    assert [r["rank"] for r in got] == list(range(world))
    assert all(r["world_size"] == world and r["sum"] == world * (world + 1) / 2 for r in got)
    for r, row in zip(got, plan.ranks):
        assert (int(r["env"]["GROUP_RANK"]), int(r["env"]["LOCAL_RANK"])) == (row["node"], row["local_rank"])
        assert int(r["env"]["LOCAL_WORLD_SIZE"]) == plan.gpus_per_node
    program = engine_program(plan, ExportOptions())
    expected = program.argv({f.name: str(config_dir / f.name) for f in program.config_files} if config_dir else None)
    assert all(r["argv"][-len(expected):] == expected for r in got)
    return got


def test_torchrun_script_one_node_two_ranks(tmp_path):
    plan = make_export_plan(tp=2, gpus_per_node=2, global_batch=8)
    script = write_export(plan, "megatron", tmp_path / "export")["megatron_launch.sh"]
    out = tmp_path / "out"
    subprocess.run(["bash", str(script)], env=base_env(out), check=True, timeout=TIMEOUT_S, capture_output=True)
    got = assert_ran_the_plan(plan, out)
    assert all(r["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" for r in got)  # tp = 2 needs it


def test_torchrun_script_two_nodes(tmp_path):
    plan = make_export_plan(engine="torchtitan", dp=2, gpus_per_node=1, zero=3, global_batch=8)
    script = write_export(plan, "torchtitan", tmp_path / "export")["torchtitan_launch.sh"]
    out = tmp_path / "out"
    env = base_env(out, MASTER_ADDR="127.0.0.1")
    nodes = [subprocess.Popen(["bash", str(script)], env={**env, "NODE_RANK": str(node)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for node in (1, 0)]
    for node in nodes:
        assert node.wait(timeout=TIMEOUT_S) == 0, node.stdout.read().decode()[-3000:]
    got = assert_ran_the_plan(plan, out)
    assert all(r["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] is None for r in got)


def test_torchrun_script_demands_a_node_rank_on_multi_node_plans(tmp_path):
    plan = make_export_plan(dp=2, gpus_per_node=1, global_batch=8)
    script = write_export(plan, "megatron", tmp_path / "export")["megatron_launch.sh"]
    env = base_env(tmp_path / "out", MASTER_ADDR="127.0.0.1")
    result = subprocess.run(["bash", str(script)], check=False, env=env, capture_output=True, text=True,
                            timeout=TIMEOUT_S)
    assert result.returncode != 0 and "set NODE_RANK to the index of this node" in result.stderr


def slurm_env(tmp_path: Path, out: Path, nodes: int) -> dict[str, str]:
    shims = tmp_path / "slurm-bin"
    shims.mkdir(exist_ok=True)
    for name, text in (("srun", SRUN_SHIM), ("scontrol", SCONTROL_SHIM)):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    env = base_env(out, SLURM_JOB_ID="4242", SLURM_NNODES=str(nodes),
                   SLURM_JOB_NODELIST=",".join(["localhost"] * nodes), SLURM_SUBMIT_DIR=str(tmp_path / "export"))
    env["PATH"] = f"{shims}:{env['PATH']}"
    return env


def test_slurm_script_starts_one_torchrun_per_node(tmp_path):
    plan = make_export_plan(engine="deepspeed", dp=2, gpus_per_node=1, zero=1, global_batch=8)
    script = write_export(plan, "slurm", tmp_path / "export")["slurm.sbatch"]
    out = tmp_path / "out"
    result = subprocess.run(["bash", str(script)], check=False, env=slurm_env(tmp_path, out, 2),
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    got = assert_ran_the_plan(plan, out, config_dir=tmp_path / "export")
    assert [r["env"]["SLURM_NODEID"] for r in got] == ["0", "1"]  # torchrun's node rank is the SLURM node
    config = got[0]["argv"][got[0]["argv"].index("--deepspeed_config") + 1]
    assert Path(config) == tmp_path / "export" / "ds_config.json" and Path(config).is_file()


def test_slurm_script_refuses_an_allocation_of_the_wrong_size(tmp_path):
    plan = make_export_plan(dp=2, gpus_per_node=1, global_batch=8)
    script = write_export(plan, "slurm", tmp_path / "export")["slurm.sbatch"]
    result = subprocess.run(["bash", str(script)], check=False, env=slurm_env(tmp_path, tmp_path / "out", 3),
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 2 and "the plan needs 2 nodes; this allocation has 3" in result.stderr
    assert records(tmp_path / "out") == []


def test_pytorchjob_pods_rendezvous(tmp_path):
    plan = make_export_plan(dp=2, tp=1, gpus_per_node=1, global_batch=8)
    manifest = write_export(plan, "k8s", tmp_path / "export")["pytorchjob.yaml"]
    (job,) = list(yaml.safe_load_all(manifest.read_text()))
    out = tmp_path / "out"
    env = base_env(out, MASTER_ADDR="127.0.0.1")  # with MASTER_PORT and RANK: what the operator injects
    pods = []
    for role, rank in (("Worker", 1), ("Master", 0)):
        container = job["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"][0]
        pod_env = {**env, **{e["name"]: e["value"] for e in container["env"]}, "RANK": str(rank), "WORLD_SIZE": "2"}
        pods.append(subprocess.Popen([*container["command"], *container["args"]], env=pod_env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for pod in pods:
        assert pod.wait(timeout=TIMEOUT_S) == 0, pod.stdout.read().decode()[-3000:]
    assert_ran_the_plan(plan, out)
