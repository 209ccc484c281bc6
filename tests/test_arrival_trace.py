"""Request-arrival traces (planner/serving/arrival_trace.py): each format read to hand-computed rates, cv² and lengths;
every malformed file one InputError line; a fuzz property that nothing else escapes."""

from __future__ import annotations

import json
import math

import pytest
from fuzz_kit import message_problem
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paraplan.errors import InputError
from paraplan.planner.serving import arrival_trace
from paraplan.planner.serving.arrival_trace import read_trace
from paraplan.planner.serving.queueing import parse_arrival

# Arrivals at 0, 1 and 3 s: rate (3 - 1)/3 = 2/3 per second; gaps 1 and 2, mean 1.5, variance 0.25: cv² = 1/9.
RATE, CV2 = 2 / 3, 1 / 9


def write(tmp_path, name: str, content: str | bytes):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def assert_trace(trace, rate=RATE, cv2=CV2, count=3):
    assert trace.num_requests == count
    assert trace.arrivals.rate_per_s == pytest.approx(rate, rel=1e-12)
    assert trace.arrivals.cv2 == pytest.approx(cv2, rel=1e-12, abs=1e-15)


def test_csv_with_lengths(tmp_path):
    trace = read_trace(write(tmp_path, "t.csv",
                             "timestamp,input_len,output_len,model\n3,300,30,a\n0,100,10,a\n1,200,20,b\n"))
    assert_trace(trace)
    assert trace.span_s == 3.0
    assert trace.input_tokens.mean_tokens == 200.0
    assert trace.input_tokens.cv == pytest.approx(math.sqrt(20000 / 3) / 200, rel=1e-12)  # population std / mean
    assert trace.output_tokens.mean_tokens == 20.0
    assert "3 requests" in trace.arrivals.source


@pytest.mark.parametrize(("header", "rows"), [
    ("timestamp_ms", "0\n1000\n3000\n"),
    ("Arrival Time", "0\n1\n3\n"),
    ("Timestamp,Model,Request tokens,Response tokens", "0,ChatGPT,10,1\n1,GPT-4,20,2\n3,ChatGPT,30,3\n"),  # BurstGPT
    ("TIMESTAMP,ContextTokens,GeneratedTokens",  # Azure LLM inference traces: date-times
     "2023-11-16 18:15:46.5,10,1\n2023-11-16 18:15:47.5,20,2\n2023-11-16 18:15:49.5,30,3\n"),
])
def test_csv_headers_and_units(tmp_path, header, rows):
    trace = read_trace(write(tmp_path, "t.csv", f"\ufeff{header}\n{rows}"))
    assert_trace(trace)
    if "tokens" in header.lower():
        assert trace.input_tokens.mean_tokens == 20.0 and trace.output_tokens.mean_tokens == 2.0


def test_plain_numbers_with_comments(tmp_path):
    assert_trace(read_trace(write(tmp_path, "t.txt", "# arrivals, seconds\n3\n\n0\n1.0\n")))
    assert read_trace(write(tmp_path, "u.txt", "0\n0.5\n1\n1.5\n")).arrivals.cv2 == 0.0  # regular arrivals


def test_jsonl_mooncake_timestamps_are_milliseconds(tmp_path):
    lines = [{"timestamp": t, "input_length": i, "output_length": 5, "hash_ids": [1, 2]}
             for t, i in ((0, 100), (1000, 200), (3000, 300))]
    trace = read_trace(write(tmp_path, "m.jsonl", "\n".join(json.dumps(line) for line in lines) + "\n"))
    assert_trace(trace)
    assert trace.input_tokens.mean_tokens == 200.0 and trace.output_tokens.cv == 0.0


def test_jsonl_seconds_and_json_documents(tmp_path):
    jsonl = ('{"arrival_time": 0, "prompt_len": 4}\n\n{"arrival_time": 1.0, "prompt_len": 4}\n'
             '{"arrival_time": 3, "prompt_len": 4}\n')
    assert_trace(read_trace(write(tmp_path, "s.jsonl", jsonl)))
    listed = json.dumps([{"time": 0}, {"time": 3}, {"time": 1}], indent=2)
    assert_trace(read_trace(write(tmp_path, "l.json", listed)))
    vllm = {"duration": 3.0, "start_times": [10.0, 11.0, 13.0], "input_lens": [1, 2, 3], "output_lens": [4, 4, 4],
            "ttfts": [0.1, 0.1, 0.1]}  # vLLM bench serve --save-result --save-detailed
    trace = read_trace(write(tmp_path, "v.json", json.dumps(vllm)))
    assert_trace(trace)
    assert trace.input_tokens.mean_tokens == 2.0 and trace.output_tokens.mean_tokens == 4.0


def test_arrival_option_keeps_or_rescales_the_trace(tmp_path):
    path = write(tmp_path, "t.txt", "0\n1\n3\n")
    own = parse_arrival(f"trace:{path}", None)
    assert own.rate_per_s == pytest.approx(RATE) and own.cv2 == pytest.approx(CV2)
    scaled = parse_arrival(f"trace:{path}", 50.0)
    assert scaled.rate_per_s == 50.0 and scaled.cv2 == own.cv2 and "scaled from 0.6667/s" in scaled.source


@pytest.mark.parametrize(("name", "content", "needle"), [
    ("t.csv", "when,latency\n1,2\n3,4\n", "no arrival-time column"),
    ("t.csv", "timestamp\n0\nsoon\n", "line 3: timestamp must be a finite number >= 0, got 'soon'"),
    ("t.csv", "timestamp\n0\n-1\n", "line 3: timestamp must be a finite number >= 0"),
    ("t.csv", "timestamp\n0\nnan\n", "finite number"),
    ("t.csv", "timestamp,isl\n0,5\n1\n", "line 3: 1 fields where the header has 2"),
    ("t.csv", "timestamp,isl\n0,5\n1,-5\n", "isl must be a finite number >= 0"),
    ("t.csv", "timestamp,isl\n0,5\n1,1e9\n", "more than 16,777,216"),
    ("t.txt", "5\n", "1 arrival(s); a rate needs at least 2"),
    ("t.txt", "5\n5\n5\n", "all 3 arrivals at the same time"),
    ("t.txt", "1700000000000\n1700000001000\n", "are these milliseconds?"),
    ("t.txt", "  \n\n", "is empty"),
    ("t.txt", "1\n2\nthree\n", "line 3: time must be a finite number"),
    ("t.jsonl", '{"timestamp": 0}\n{"timestamp": true}\n', "line 2: timestamp must be a number, got True"),
    ("t.jsonl", '{"timestamp": 0}\n{"ts": 1}\n', "line 2: no 'timestamp', which the first request has"),
    ("t.jsonl", '{"timestamp": 0}\n{"timestamp": 1\n', "line 2: malformed JSON"),
    ("t.jsonl", '{"timestamp": 0}\n[1]\n', "line 2: expected a JSON object"),
    ("t.jsonl", '{"timestamp": 0}\n{"timestamp": 1' + "0" * 400 + "}\n", "line 2: timestamp must be a finite number"),
    ("t.json", '{"model": "x"}', "no arrival-time key"),
    ("t.json", "[]", "expected JSON objects"),
    ("t.json", '{"start_times": [1, 2], "input_lens": [1]}', "input_lens has 1 entries, start_times 2"),
])
def test_malformed_traces_are_one_line(tmp_path, name, content, needle):
    with pytest.raises(InputError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")) as caught:
        read_trace(write(tmp_path, name, content))
    assert message_problem(caught.value) is None


def test_bad_utf8_too_large_and_too_many(tmp_path, monkeypatch):
    with pytest.raises(InputError, match="line 2 is not UTF-8"):
        read_trace(write(tmp_path, "b.txt", b"0\n\xff\xfe\n"))
    monkeypatch.setattr(arrival_trace, "MAX_TRACE_BYTES", 8)
    with pytest.raises(InputError, match="too large for a request trace"):
        read_trace(write(tmp_path, "big.txt", "0\n1\n2\n3\n4\n"))
    monkeypatch.setattr(arrival_trace, "MAX_TRACE_BYTES", 1 << 20)
    monkeypatch.setattr(arrival_trace, "MAX_TRACE_REQUESTS", 3)
    for name, content in (("n.txt", "0\n1\n2\n3\n"), ("n.jsonl", '{"time": 0}\n' * 4), ("n.csv", "time\n0\n1\n2\n3\n")):
        with pytest.raises(InputError, match="more than [34] (requests|rows)"):  # a CSV counts its header row
            read_trace(write(tmp_path, name, content))
    assert read_trace(write(tmp_path, "ok.txt", "0\n1\n3\n")).num_requests == 3


LINES = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(str), st.integers(-10, 10**30).map(str),
                  st.text(max_size=12), st.sampled_from(["timestamp", "timestamp,isl", "{\"timestamp\": 1}", "[",
                                                         "{\"start_times\": [1, 2]}", "# c", ""]))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINES, max_size=8), name=st.sampled_from(["t.csv", "t.jsonl", "t.txt"]))
def test_fuzzed_traces_raise_only_one_line_input_errors(tmp_path, lines, name):
    try:
        trace = read_trace(write(tmp_path, name, "\n".join(lines).encode("utf-8", "surrogatepass")))
    except InputError as exc:
        assert message_problem(exc) is None, str(exc)
        return
    assert trace.num_requests >= 2 and trace.arrivals.rate_per_s > 0 and math.isfinite(trace.arrivals.cv2)


def test_jsonl_lines_at_the_depth_limit_are_read_one_by_one(tmp_path):
    """Each line nests as deep as the reader allows; the joined array would be one level deeper, so the reader
    falls back to line by line instead of refusing a valid trace."""
    from paraplan.files import MAX_JSON_DEPTH

    extra = '{"a": ' * (MAX_JSON_DEPTH - 1) + "1" + "}" * (MAX_JSON_DEPTH - 1)  # the line nests MAX_JSON_DEPTH deep
    lines = [f'{{"timestamp": {t}, "extra": {extra}}}' for t in (0.0, 1.0, 3.0)]
    path = tmp_path / "deep.jsonl"
    path.write_text("\n".join(lines) + "\n")
    trace = read_trace(path)
    assert trace.num_requests == 3 and trace.arrivals.rate_per_s == pytest.approx(2 / 3.0)
