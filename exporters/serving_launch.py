"""serve.sh and k8s.yaml around the engine commands of one serving deployment.

serve.sh writes one command per process (a worker, or its share of one node), each with its own
CUDA_VISIBLE_DEVICES and ports, under ``case "$NODE_RANK"``: the same file runs on every node and
starts what that node holds, so the commands are readable and diffable one by one, which a single
command plus a replica count would hide. Node 0 also starts the router (SGLang) or the disaggregated
front end (TensorRT-LLM); for vLLM it lists the servers a load balancer or proxy goes in front of.
A deployment whose pools run on different GPU types says which type each node must be (serve.sh) or
pins each pool's pods to nodes labelled with its type (k8s.yaml).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from paraplan.errors import InputError
from paraplan.exporters.program import OutputFile, comment_block
from paraplan.exporters.serving_engines import (
    BOOTSTRAP_PORT,
    HTTP_PORT,
    Slot,
    Word,
    sglang_command,
    trtllm_command,
    vllm_command,
)
from paraplan.exporters.serving_pools import Process, gpu_nodes, node_ranges, pool_labels
from paraplan.planner.serving.pool_shape import ServingPool

ROUTER_PORT = 8000  # the deployment's public port, on node 0
CONFIG_MOUNT = "/etc/paraplan"
K8S_PORT = 8000  # the engine's port inside a pod
GPU_LABEL = "paraplan.dev/gpu"  # node label a mixed deployment's pods select their GPU type by
IMAGES = {"vllm": "vllm/vllm-openai:v0.33.0", "sglang": "lmsysorg/sglang:v0.5.23",
          "trtllm": "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"}  # tags of the checked versions; set your own


@dataclass(frozen=True, slots=True, kw_only=True)
class Deployment:
    """What the launchers need: the plan's deployment entry, its pools and the model to load."""

    entry: dict[str, Any]
    pools: list[ServingPool]
    model: str
    """Hugging Face repository or checkpoint folder."""
    options_files: dict[str, str]
    """Pool label (see ``labels``) -> TRT-LLM extra options file name."""
    processes: tuple[Process, ...]
    """Every engine process on its node and GPUs (serving_pools.place of ``pools``), placed once."""

    @property
    def engine(self) -> str:
        """The deployment's serving engine: vllm, sglang or trtllm."""
        return str(self.entry["engine"])

    @property
    def labels(self) -> list[str]:
        """Each pool's unique name: its role, or role-i when several pools share the role."""
        return pool_labels(self.pools)

    @property
    def gpu_types(self) -> list[str]:
        """The GPU types of the pools, in plan order, each once."""
        return list(dict.fromkeys(pool.gpu for pool in self.pools))


def share(pool: ServingPool) -> str:
    """The pool's share of the requests, in words: "40% of requests (10% per worker)"."""
    frac = pool.traffic_frac or 0.0
    return f"{frac * 100:.3g}% of requests ({frac * 100 / pool.num_workers:.3g}% per worker)"


def engine_command(dep: Deployment, pool: ServingPool, at: Slot) -> tuple[list[Word], dict[str, Word]]:
    """The deployment engine's command for one process."""
    if dep.engine == "vllm":
        return vllm_command(pool, dep.entry, at)
    if dep.engine == "sglang":
        return sglang_command(pool, dep.entry, at)
    return trtllm_command(pool, at)


def _bash(word: Word) -> str:
    return shlex.quote(word) if isinstance(word, str) else word[0]


def _host(node: int) -> Word:
    return (f'"${{HOSTS[{node}]}}"', "")


def _url(node: int, port: int) -> str:
    return f'"http://${{HOSTS[{node}]}}:{port}"'


def _bash_slot(dep: Deployment, pool: ServingPool, proc: Process) -> Slot:
    spans = pool.nodes_per_worker > 1
    options = dep.options_files.get(dep.labels[proc.pool_index])
    return Slot(model=('"$MODEL"', ""), port=HTTP_PORT + proc.slot, slot=proc.slot, node_in_worker=proc.node_in_worker,
                host=_host(proc.node), head=_host(proc.first_node) if spans else None,
                extra_options=(f'"$CONFIG_DIR"/{shlex.quote(options)}', "") if options else None)


def _process_lines(dep: Deployment, proc: Process) -> list[str]:
    pool, label = dep.pools[proc.pool_index], dep.labels[proc.pool_index]
    argv, env = engine_command(dep, pool, _bash_slot(dep, pool, proc))
    if dep.engine == "trtllm" and pool.nodes_per_worker > 1:
        if proc.node_in_worker:
            return [f"    # {label} worker {proc.worker}: started over MPI from node {proc.first_node}"]
        hosts = ",".join(f"${{HOSTS[{proc.first_node + i}]}}:{pool.num_node_gpus}"
                         for i in range(pool.nodes_per_worker))
        argv = ["mpirun", "-n", str(pool.gpus_per_worker), "--host", (f'"{hosts}"', ""), "trtllm-llmapi-launch", *argv]
    gpus = "" if len(proc.gpus) == pool.num_node_gpus else f"CUDA_VISIBLE_DEVICES={','.join(map(str, proc.gpus))} "
    prefix = gpus + "".join(f"{name}={_bash(value)} " for name, value in env.items())
    what = f"{label} worker {proc.worker}" + (f", node {proc.node_in_worker + 1} of {pool.nodes_per_worker}"
                                                  if pool.nodes_per_worker > 1 else "")
    log = f'"$LOG_DIR"/{label}-{proc.worker}-{proc.node_in_worker}.log'
    return [f"    # {what}", f"    {prefix}{' '.join(_bash(w) for w in argv)} > {log} 2>&1 &"]


def _server_urls(dep: Deployment, role: str, index: int | None = None) -> list[tuple[int, int]]:
    """(node, port) of every API server of the pools with ``role`` (or of pool ``index`` only): each worker's
    first-node process."""
    return [(p.node, HTTP_PORT + p.slot) for p in dep.processes
            if dep.pools[p.pool_index].role == role and p.node_in_worker == 0 and index in (None, p.pool_index)]


def _traffic_lines(dep: Deployment) -> list[str]:
    """The plan's split of requests over several aggregated pools, for the router or load balancer."""
    pools = [(label, p) for label, p in zip(dep.labels, dep.pools, strict=True) if p.traffic_frac is not None]
    if len(pools) < 2:
        return []
    lines = [f"    # {label} ({p.num_workers} x {p.gpu}): {share(p)}" for label, p in pools]
    if dep.engine == "sglang":  # sglang-router 0.3.2 router_args.py: --policy, balance thresholds, no weights
        return [("    # the plan's split of requests; sglang-router 0.3.2 takes no per-worker weights: its cache_aware "
                 "policy sends to the least-loaded worker once loads diverge (--balance-abs/rel-threshold)"), *lines]
    return ["    # the plan's split of requests: weight each pool's servers in the load balancer to match", *lines]


def _front_lines(dep: Deployment) -> list[str]:
    """What node 0 runs (or says) in front of the workers."""
    disagg = dep.entry["mode"] == "disagg"
    agg = _server_urls(dep, "aggregated")
    prefill, decode = _server_urls(dep, "prefill"), _server_urls(dep, "decode")
    if dep.engine == "sglang" and (disagg or len(agg) > 1):
        args = ["--pd-disaggregation"] + [w for n, port in prefill for w in
                                          ("--prefill", _url(n, port), str(BOOTSTRAP_PORT + port - HTTP_PORT))] + \
            [w for n, port in decode for w in ("--decode", _url(n, port))] if disagg else \
            ["--worker-urls", *[_url(n, port) for n, port in agg]]
        return [*([] if disagg else _traffic_lines(dep)),
                "    # the router: the deployment's endpoint (it health-checks the workers and waits for them)",
                (f"    python -m sglang_router.launch_router --host 0.0.0.0 --port {ROUTER_PORT} {' '.join(args)} "
                '> "$LOG_DIR"/router.log 2>&1 &')]
    if dep.engine == "trtllm" and disagg:
        return ["    # the disaggregated front end: disagg-config.yaml with node N's host for paraplan-node-N",
                '    RUN_CONFIG=$(mktemp)',
                '    CONFIG_TEXT=$(<"$CONFIG_DIR"/disagg-config.yaml)',
                '    for i in "${!HOSTS[@]}"; do CONFIG_TEXT=${CONFIG_TEXT//paraplan-node-$i:/${HOSTS[$i]}:}; done',
                '    printf \'%s\\n\' "$CONFIG_TEXT" > "$RUN_CONFIG"',
                ('    trtllm-serve disaggregated -c "$RUN_CONFIG" --server_start_timeout 3600 '
                '> "$LOG_DIR"/disaggregated.log 2>&1 &')]
    servers = [("prefill", prefill), ("decode", decode)] if disagg else [("API", agg)] if len(dep.pools) == 1 else \
        [(f"{label} API", _server_urls(dep, "aggregated", i)) for i, label in enumerate(dep.labels)]
    lines = [f"    # {name} servers: " + ", ".join(f"node {n} port {port}" for n, port in urls)
             for name, urls in servers]
    if disagg:
        return lines + [("    # vLLM ships no production P/D proxy: route each request to a prefill server "
                         "(max_tokens 1, kv_transfer_params) then to a decode server, e.g. vLLM's "
                         "examples/online_serving/disaggregated_serving proxy, vllm-router or llm-d.")]
    return lines + (["    # put a load balancer over these servers"] + _traffic_lines(dep) if len(agg) > 1 else
                    ["    # the endpoint: node 0"])


def serve_script(dep: Deployment, header: list[str]) -> OutputFile:
    """serve.sh: run on every node with NODE_RANK (and NODE_HOSTS when there are several)."""
    processes = dep.processes
    num_nodes = processes[-1].node + 1
    multi = num_nodes > 1
    usage = (f'Run on each of the {num_nodes} nodes:  NODE_RANK=<0..{num_nodes - 1}> NODE_HOSTS="<host of node 0> '
             '... <host of the last node>" bash serve.sh') if multi else "Run:  bash serve.sh"
    types = gpu_nodes(dep.pools, processes)
    node_gpu = {node: gpu for gpu, nodes in types.items() for node in nodes}
    placement = [("Each node must be of its GPU type: " + "; ".join(f"{gpu}: {node_ranges(nodes)}"
                                                                    for gpu, nodes in types.items()) + ".")]
    lines = ["#!/usr/bin/env bash", comment_block(header + [usage] + (placement if len(types) > 1 else []) + [
        f"Environment: MODEL (default {dep.model}), CONFIG_DIR (this folder), LOG_DIR (./logs)."]),
             "set -euo pipefail",
             'CONFIG_DIR=${CONFIG_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}',
             f"MODEL=${{MODEL:-{shlex.quote(dep.model)}}}",
             'LOG_DIR=${LOG_DIR:-logs}', 'mkdir -p "$LOG_DIR"',
             f"NUM_NODES={num_nodes}  # from the plan",
             (f"NODE_RANK=${{NODE_RANK:?set NODE_RANK to the index of this node, 0 to {num_nodes - 1}}}" if multi
              else "NODE_RANK=${NODE_RANK:-0}"),
             ('read -r -a HOSTS <<< "${NODE_HOSTS:?set NODE_HOSTS to the hosts of all nodes, node 0 first}"' if multi
              else 'read -r -a HOSTS <<< "${NODE_HOSTS:-127.0.0.1}"'),
             'if [[ ${#HOSTS[@]} -ne $NUM_NODES ]]; then',
             '  echo "error: NODE_HOSTS names ${#HOSTS[@]} hosts; the plan needs $NUM_NODES" >&2; exit 2',
             "fi", 'case "$NODE_RANK" in']
    on_node: dict[int, list[Process]] = {}
    for proc in processes:
        on_node.setdefault(proc.node, []).append(proc)
    for node in range(num_nodes):
        lines.append(f"  {node})" + (f"  # node {node}: {node_gpu[node]}" if len(types) > 1 else ""))
        for proc in on_node.get(node, []):
            lines += _process_lines(dep, proc)
        lines += _front_lines(dep) if node == 0 else []
        lines.append("    ;;")
    lines += [f'  *) echo "error: NODE_RANK must be 0 to {num_nodes - 1}, got $NODE_RANK" >&2; exit 2 ;;', "esac",
              "wait"]
    return OutputFile(name="serve.sh", text="\n".join(lines) + "\n", executable=True)


def _k8s_words(dep: Deployment, index: int) -> tuple[list[str], dict[str, Word]]:
    pool, options = dep.pools[index], dep.options_files.get(dep.labels[index])
    at = Slot(model=dep.model, port=K8S_PORT, slot=0, node_in_worker=0, host=("", "$(POD_IP)"), head=None,
              extra_options=f"{CONFIG_MOUNT}/{options}" if options else None)
    argv, env = engine_command(dep, pool, at)  # slot 0: SGLang's bootstrap port is its default 8998
    return [w if isinstance(w, str) else w[1] for w in argv], env


def k8s_manifest(dep: Deployment, name: str, header: list[str], configs: list[OutputFile]) -> OutputFile:
    """A Deployment and a headless Service per pool (replicas = workers, GPUs = gpus_per_worker); with several GPU
    types, each pool's pods select nodes labelled GPU_LABEL=<its GPU type>."""
    documents: list[dict[str, Any]] = []
    mixed = len(dep.gpu_types) > 1
    config = f"{name}-config" if configs else None
    for index, (label, pool) in enumerate(zip(dep.labels, dep.pools, strict=True)):
        if pool.nodes_per_worker > 1:
            raise InputError(f"k8s export covers workers within one node; this plan's {label} workers span "
                             f"{pool.nodes_per_worker} nodes (use --export {dep.engine}, or a LeaderWorkerSet)")
        argv, env = _k8s_words(dep, index)
        documents += [_deployment(dep, pool, f"{name}-{label}", argv, env, config, mixed),
                      _service(f"{name}-{label}", pool, dep.engine)]
    if config:
        documents.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": config},
                          "data": {f.name: f.text for f in configs}})
    body = yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False, width=10_000)
    labels = [(f"Pools run on different GPU types: each pod selects nodes labelled {GPU_LABEL}=<GPU type>; label "
               "them first: " + "; ".join(f"kubectl label node NODE {GPU_LABEL}={gpu}" for gpu in dep.gpu_types))]
    return OutputFile(name="k8s.yaml", text=comment_block(header + (labels if mixed else []) +
                                                          ["kubectl apply -f k8s.yaml"]) + "\n" + body)


def _deployment(dep: Deployment, pool: ServingPool, app: str, argv: list[str], env: dict[str, Word],
                config: str | None, select_gpu: bool) -> dict[str, Any]:
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    container: dict[str, Any] = {
        "name": dep.engine, "image": IMAGES[dep.engine], "command": argv[:1], "args": argv[1:],
        "env": [pod_ip] + [{"name": k, "value": v if isinstance(v, str) else v[1]} for k, v in env.items()],
        "ports": [{"name": "http", "containerPort": K8S_PORT}],
        "resources": {"limits": {"nvidia.com/gpu": pool.gpus_per_worker}},
        # every engine serves GET /health (vLLM serve/instrumentator/health.py, SGLang http_server.py,
        # TRT-LLM tensorrt_llm/serve/openai_server.py); loading a large checkpoint takes minutes, hence the long
        # threshold
        "readinessProbe": {"httpGet": {"path": "/health", "port": K8S_PORT}, "periodSeconds": 10,
                           "failureThreshold": 360},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if config:
        container["volumeMounts"].append({"name": "paraplan-config", "mountPath": CONFIG_MOUNT, "readOnly": True})
        volumes.append({"name": "paraplan-config", "configMap": {"name": config}})
    pod: dict[str, Any] = {"containers": [container], "volumes": volumes}
    if select_gpu:
        pod["nodeSelector"] = {GPU_LABEL: pool.gpu}
    def labels() -> dict[str, str]:  # a fresh dict each: shared ones would be dumped as YAML anchors
        return {"app": app}

    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": app, "labels": labels()},
            "spec": {"replicas": pool.num_workers, "selector": {"matchLabels": labels()},
                     "template": {"metadata": {"labels": labels()},
                                  "spec": pod}}}


def _service(app: str, pool: ServingPool, engine: str) -> dict[str, Any]:
    ports = [{"name": "http", "port": K8S_PORT, "targetPort": K8S_PORT}]
    if engine == "sglang" and pool.role == "prefill":
        ports.append({"name": "bootstrap", "port": BOOTSTRAP_PORT, "targetPort": BOOTSTRAP_PORT})
    # headless: DNS lists every pod, so a router can address each worker (P/D routing needs the exact instance)
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": app},
            "spec": {"clusterIP": "None", "selector": {"app": app}, "ports": ports}}


def trtllm_disagg_config(dep: Deployment, header: list[str]) -> OutputFile:
    """disagg-config.yaml for ``trtllm-serve disaggregated -c`` (llmapi/disagg_utils.py extract_disagg_cfg):
    the context (prefill) and generation (decode) servers, paraplan-node-N standing for node N's host."""
    document: dict[str, Any] = {"hostname": "0.0.0.0", "port": ROUTER_PORT, "backend": "pytorch"}
    for key, role in (("context_servers", "prefill"), ("generation_servers", "decode")):
        pool = next(p for p in dep.pools if p.role == role)
        urls = [f"paraplan-node-{node}:{port}" for node, port in _server_urls(dep, role)]
        document[key] = {"num_instances": len(urls), "urls": urls, "tensor_parallel_size": pool.tp_group,
                         "pipeline_parallel_size": pool.pp}
    body = yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=10_000)
    return OutputFile(name="disagg-config.yaml", text=comment_block(header) + "\n" + body)
