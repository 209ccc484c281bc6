"""Work bounded by the size of what a user hands over (issue 20): no input of a few kilobytes may
take super-linear time or unbounded memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.cost_models.ingest.megatron_log import fields_of, parse_megatron_log


def test_megatron_fields_split_like_megatron_prints_them():
    line = " consumed samples: 512 | elapsed time per iteration (ms): 1234.5 | learning rate: 3.0E-04 | loss scale: 1.0 |"
    assert fields_of(line) == {"consumed samples": "512", "elapsed time per iteration (ms)": "1234.5",
                               "learning rate": "3.0E-04", "loss scale": "1.0"}
    assert fields_of(" no colon here | key: | : value |") == {}


def test_a_line_of_spaces_parses_in_linear_time():
    # 100,000 spaces: the nested lazy pattern this replaced needed ~4.6 s for 400 and grew cubically, so
    # this line would not finish; the split reads it at once.
    spaces = " " * 100_000
    text = f" iteration        1/      10 | elapsed time per iteration (ms): 1000.0 |{spaces}x\n"
    parsed = parse_megatron_log(Path("log.txt"), text)
    assert [m.time_s for m in parsed.measurements] == [1.0]
    assert fields_of(spaces + ":" + spaces) == {}


@pytest.mark.parametrize("count", [1, 1000])
def test_memory_line_with_padding(count):
    text = f"[Rank 0] (after 10 iterations) memory (MB) | allocated: 100.0 |{' ' * count}| max allocated: 200.0\n"
    parsed = parse_megatron_log(Path("log.txt"), text)
    assert parsed.measurements[0].params == {"allocated_bytes": 100 * 2**20, "max_allocated_bytes": 200 * 2**20}
