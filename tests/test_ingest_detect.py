"""ingest --kind auto on logs as people hand them over: trimmed with grep, prefixed by launchers, with
NCCL debug lines at the top (issue 20; tests written by the messages helper on branch issue20-msgs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.measurements.ingest.detect import detect_kind

ITERATION = (" [2024-04-06 02:59:36] iteration       43/     100 | consumed samples:         5504 | elapsed time per "
             "iteration (ms): 5444.9 | throughput per GPU (TFLOP/s/GPU): 239.8 | global batch size:   128 |")
MEMORY = "[Rank 0] (after 10 iterations) memory (MB) | allocated: 24761.0 | max allocated: 65203.9"


@pytest.mark.parametrize("prefix", ["", "[default0]:", "[1,0]<stdout>:", "0: "])
def test_ingest_detects_a_grep_trimmed_megatron_log(prefix, tmp_path):
    log = tmp_path / "iterations.log"
    log.write_text(f"{prefix}{ITERATION}\n{prefix}{MEMORY}\n{prefix}{ITERATION.replace('43/', '44/')}\n")
    result = CliRunner().invoke(app, ["ingest", str(log), "--hardware", "h100-sxm", "--store", str(tmp_path / "s")])
    assert result.exit_code == 0, result.output
    assert re.search(r"iterations\.log\s+megatron-log\s+h100-sxm\s+3\b", result.stdout), result.stdout


def test_detection_still_reads_json_that_opens_with_a_bracket():
    for text in ("[\n  {\"kind\": \"gemm\"}\n]", "[1, 2]", "[]", '{"traceEvents": []}', '[ "a" ]', "[true]"):
        assert detect_kind(Path("x"), text) in ("paraplan-json", "torch-trace"), text
    assert detect_kind(Path("x"), f"{MEMORY}\n{ITERATION}\n") == "megatron-log"


def test_detection_reads_a_megatron_log_with_nccl_debug_lines():
    text = f"node0:123:123 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n{ITERATION}\n"
    assert detect_kind(Path("x"), text) == "megatron-log"
