"""Launchers around a Program: a per-node torchrun script, a SLURM batch script, a PyTorchJob.

Every launcher starts one torchrun per node with ``--nnodes``/``--nproc-per-node`` from the plan,
the node's index as ``--node-rank`` (static rendezvous at MASTER_ADDR:MASTER_PORT, so torchrun's
rank = node · gpus_per_node + local_rank matches the plan's rank map), then the Program.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from paraplan.exporters.plan_input import ExportPlan
from paraplan.exporters.program import (
    OutputFile,
    Program,
    bash_array,
    bash_entry,
    bash_env,
    bash_program_words,
    comment_block,
)
from paraplan.version import __version__

GIB = 2**30  # display only: bytes per GiB
CONFIG_MOUNT = "/etc/paraplan"
PYTORCHJOB_PORT = 23456  # kubeflow training-operator's default pytorchjob-port
# torchrun with the node rank each launcher provides; NNODES and GPUS_PER_NODE come from the plan.
_TORCHRUN = ('torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" --node-rank "{node_rank}" '
             '--master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT"')


def plan_header(plan: ExportPlan) -> list[str]:
    """What the plan is and what it predicts, for the top of every launch file."""
    doc, c = plan.document, plan.config
    estimate = doc["estimate"]
    return [
        (f"Written by paraplan {__version__} from plan rank {doc['rank']}: {plan.model.name} on "
        f"{doc['cluster']['name']} ({plan.num_gpus} x {doc['cluster']['gpu']}: {plan.num_nodes} node(s) x "
        f"{plan.gpus_per_node})."),
        (f"tp={c.tp} pp={c.pp} dp={c.dp} cp={c.cp} ep={c.ep} etp={c.etp} vpp={c.vpp} mbs={c.mbs} zero={c.zero} "
        f"recompute={c.recompute} sp={'on' if c.sp else 'off'} offload={c.offload}"),
        (f"seq {plan.seq_len}, global batch {plan.global_batch} sequences ({plan.num_microbatches} micro-batches "
        f"per step), {plan.precision}, {plan.engine}, layers per pipeline chunk {list(plan.stage_layers)}"),
        (f"Predicted: {estimate['step_time_s']:.3g} s/step, {estimate['tokens_per_s_per_gpu']:.0f} tokens/s/GPU, "
        f"MFU {estimate['mfu']:.1%}, peak {estimate['peak_memory_bytes'] / GIB:.1f} GiB/GPU "
        f"({doc['provenance']['cost_model']})."),
    ]


def _program_block(program: Program) -> list[str]:
    return [bash_env(program), bash_entry(program), *[bash_array(group) for group in program.groups]]


def torchrun_script(plan: ExportPlan, program: Program, name: str) -> OutputFile:
    """A script to run on every node: ``NODE_RANK=i MASTER_ADDR=host bash <name>``."""
    multi = plan.num_nodes > 1
    # No apostrophes inside ${...:?message}: bash would read them as quotes.
    node_rank = f"${{NODE_RANK:?set NODE_RANK to the index of this node, 0 to {plan.num_nodes - 1}}}" if multi else \
        "${NODE_RANK:-0}"
    master = "${MASTER_ADDR:?set MASTER_ADDR to the host of node 0}" if multi else "${MASTER_ADDR:-127.0.0.1}"
    usage = (f"Run on each of the {plan.num_nodes} nodes:  NODE_RANK=<0..{plan.num_nodes - 1}> "
             f"MASTER_ADDR=<host of node 0> bash {name} [extra args]") if multi else f"Run:  bash {name} [extra args]"
    lines = [
        "#!/usr/bin/env bash",
        comment_block(plan_header(plan) + [usage, ("Environment: MASTER_PORT (29500), TRAIN_SCRIPT (replaces the "
                                                  "entry point), CONFIG_DIR (this folder).")]),
        comment_block(["Not expressed: " + note for note in program.notes]),
        "set -euo pipefail",
        'CONFIG_DIR=${CONFIG_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}',
        f"NNODES={plan.num_nodes}  # from the plan",
        f"GPUS_PER_NODE={plan.gpus_per_node}  # from the plan",
        f"NODE_RANK={node_rank}",
        f"MASTER_ADDR={master}",
        "MASTER_PORT=${MASTER_PORT:-29500}",
        *_program_block(program),
        "exec " + _TORCHRUN.format(node_rank="$NODE_RANK") + " " + bash_program_words(program),
    ]
    return OutputFile(name=name, text="\n".join(line for line in lines if line) + "\n", executable=True)


def slurm_script(plan: ExportPlan, program: Program, job_name: str) -> OutputFile:
    """``sbatch slurm.sbatch``: one task per node, each running torchrun with its SLURM node index."""
    n = plan.num_nodes
    per_node = _TORCHRUN.format(node_rank="$SLURM_NODEID")
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={n}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={plan.gpus_per_node}",
        "#SBATCH --exclusive",
        f"#SBATCH --nodelist={','.join(plan.hosts)}" if plan.hosts else "",
        comment_block(plan_header(plan) + [("Submit from this folder (or set CONFIG_DIR):  sbatch slurm.sbatch "
                                           "[extra args]"), "Environment: MASTER_PORT (29500), TRAIN_SCRIPT."]),
        comment_block(["Not expressed: " + note for note in program.notes]),
        "set -euo pipefail",
        'CONFIG_DIR=${CONFIG_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}',
        f"export NNODES={n} GPUS_PER_NODE={plan.gpus_per_node}  # from the plan",
        'if [[ "${SLURM_NNODES:-0}" -ne "$NNODES" ]]; then',
        '  echo "error: the plan needs $NNODES nodes; this allocation has ${SLURM_NNODES:-none}" >&2; exit 2',
        "fi",
        *(_host_order_lines(plan) if plan.hosts else [
            # The rendezvous host is the allocation's first node: SLURM_NODEID 0 runs there.
            'MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}']),
        "MASTER_PORT=${MASTER_PORT:-29500}",
        "export MASTER_ADDR MASTER_PORT",
        *_program_block(program),
        "# One torchrun per node; srun sets SLURM_NODEID, which becomes torchrun's node rank"
        + (" (placed plans: the host's position in HOST_ORDER)." if plan.hosts else "."),
        (f"srun --nodes={n} --ntasks-per-node=1 --kill-on-bad-exit=1 "
        f"bash -c '{_NODE_RANK_FROM_HOST if plan.hosts else ''}exec {per_node} \"$@\"' torchrun "
        f"{bash_program_words(program)}"),
    ]
    return OutputFile(name="slurm.sbatch", text="\n".join(line for line in lines if line) + "\n", executable=True)


# SLURM numbers nodes by sorted host name; a placed plan needs its own order, so each task looks
# its short host name up in HOST_ORDER (bash arrays do not cross processes: it travels as
# HOST_ORDER_LIST) and passes that index to torchrun as the node rank.
_NODE_RANK_FROM_HOST = ('HOST_ORDER=($HOST_ORDER_LIST); for i in "${!HOST_ORDER[@]}"; do '
                        '[[ "${HOST_ORDER[$i]}" == "$(hostname -s)" ]] && SLURM_NODEID=$i; done; ')


def _host_order_lines(plan: ExportPlan) -> list[str]:
    """HOST_ORDER (exported for the srun tasks) and the rendezvous on node rank 0's host."""
    return [f"HOST_ORDER=({' '.join(plan.hosts)})  # node rank i runs on HOST_ORDER[i] (paraplan place)",
            "export HOST_ORDER_LIST=\"${HOST_ORDER[*]}\"",
            "MASTER_ADDR=${MASTER_ADDR:-${HOST_ORDER[0]}}"]


def pytorchjob(plan: ExportPlan, program: Program, job_name: str, image: str) -> OutputFile:
    """A Kubeflow PyTorchJob (kubeflow.org/v1): one pod per node, config files in a ConfigMap."""
    resolve = {f.name: f"{CONFIG_MOUNT}/{f.name}" for f in program.config_files}
    # The operator sets MASTER_ADDR, MASTER_PORT and RANK (the pod's index = node rank) in every pod.
    script = (f'if [[ -n "${{TRAIN_SCRIPT:-}}" ]]; then shift {len(program.entry)}; set -- "$TRAIN_SCRIPT" "$@"; fi; '
              "exec " + _TORCHRUN.format(node_rank="$RANK") + ' "$@"')
    container: dict[str, Any] = {
        "name": "pytorch", "image": image,
        "command": ["bash", "-c", script, "torchrun"],
        "args": [*program.entry, *program.argv(resolve)],
        "env": [{"name": "NNODES", "value": str(plan.num_nodes)},
                {"name": "GPUS_PER_NODE", "value": str(plan.gpus_per_node)},
                *[{"name": name, "value": value} for name, value, _ in program.env]],
        "ports": [{"name": "pytorchjob-port", "containerPort": PYTORCHJOB_PORT}],
        "resources": {"limits": {"nvidia.com/gpu": plan.gpus_per_node}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if program.config_files:
        container["volumeMounts"].append({"name": "paraplan-config", "mountPath": CONFIG_MOUNT, "readOnly": True})
        volumes.append({"name": "paraplan-config", "configMap": {"name": f"{job_name}-config"}})
    def replica(count: int) -> dict[str, Any]:  # a fresh copy each: shared dicts would be dumped as YAML anchors
        return {"replicas": count, "restartPolicy": "OnFailure",
                "template": {"spec": copy.deepcopy({"containers": [container], "volumes": volumes})}}

    replicas = {"Master": replica(1)}
    if plan.num_nodes > 1:
        replicas["Worker"] = replica(plan.num_nodes - 1)
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": job_name},
           "spec": {"nprocPerNode": str(plan.gpus_per_node), "pytorchReplicaSpecs": replicas}}
    documents = [job]
    if program.config_files:
        documents.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{job_name}-config"},
                          "data": {f.name: f.text for f in program.config_files}})
    header = comment_block(plan_header(plan) + [(f"kubectl apply -f pytorchjob.yaml  (image: {image}; set yours with "
                                                "'paraplan export --image')")]
                           + ["Not expressed: " + note for note in program.notes])
    body = yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False, width=10_000)
    return OutputFile(name="pytorchjob.yaml", text=header + "\n" + body)
