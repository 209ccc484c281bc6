"""The JSON format: the plan itself plus its rank map and expert map, for launchers of your own.

Maps are written one rank per line, so a 16,384-GPU map stays a readable (and diffable) file.
"""

from __future__ import annotations

import json
from typing import Any

from paraplan.errors import InputError
from paraplan.exporters.plan_input import ExportPlan
from paraplan.exporters.program import OutputFile
from paraplan.planner.layout import RANK_ORDER, expert_map
from paraplan.planner.plan import SCHEMA_VERSION


def rows_json(header: dict[str, Any], key: str, rows: list[Any]) -> str:
    """``header`` as an indented object whose last member ``key`` lists ``rows``, one per line."""
    lines = ["{"] + [f"  {json.dumps(name)}: {json.dumps(value)}," for name, value in header.items()]
    body = ",\n".join("    " + json.dumps(row) for row in rows)
    lines += [f"  {json.dumps(key)}: [" + ("" if not rows else "\n" + body + "\n  ") + "]", "}"]
    return "\n".join(lines) + "\n"


def rank_map_file(plan: ExportPlan) -> OutputFile:
    """rank_map.json: global rank -> node, local rank and tp/cp/dp/pp coordinates."""
    header = {"schema_version": SCHEMA_VERSION, "rank_order": RANK_ORDER, "world_size": plan.num_gpus,
              "num_nodes": plan.num_nodes, "gpus_per_node": plan.gpus_per_node,
              "degrees": {"tp": plan.config.tp, "cp": plan.config.cp, "dp": plan.config.dp, "pp": plan.config.pp},
              "stage_layers": list(plan.stage_layers)}
    return OutputFile(name="rank_map.json", text=rows_json(header, "ranks", list(plan.ranks)))


def expert_map_file(plan: ExportPlan) -> OutputFile:
    """expert_map.json: expert-parallel groups and the experts of every rank (empty for dense models)."""
    c, model = plan.config, plan.model
    try:
        mapping = expert_map(num_experts=model.num_experts if model.is_moe else 0, moe_layers=list(model.moe_layers),
                             ep=c.ep, etp=c.etp, world_size=plan.num_gpus, pp=c.pp)
    except ValueError as exc:
        raise InputError(f"plan config: {exc}") from None
    ranks = mapping.pop("ranks")
    placed = plan.document["placement"].get("expert_placement")
    if placed is not None:  # 'paraplan experts --plan-out': per MoE layer, the experts each EP rank holds
        mapping["placement"] = f"optimized ({placed['source']}, {placed['replicas']} replicas)"
        ranks = [{**row, "experts_by_layer": [layer[row["ep"]] for layer in placed["layers"]],
                  "token_share_by_layer": [layer[row["ep"]] for layer in placed["token_share"]]} for row in ranks]
    return OutputFile(name="expert_map.json", text=rows_json({"schema_version": SCHEMA_VERSION, **mapping}, "ranks",
                                                             ranks))


def plan_file(plan: ExportPlan) -> OutputFile:
    """plan.json: the plan alone in a plan file, which 'paraplan export' reads back."""
    document = {"schema_version": SCHEMA_VERSION, "plans": [plan.document]}
    return OutputFile(name="plan.json", text=json.dumps(document, indent=2, allow_nan=False) + "\n")
