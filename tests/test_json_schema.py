"""The plan schema and its small checker: real plans validate, each kind of violation is named by
its path, and arbitrary JSON-like values never crash the checker."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paraplan.errors import InputError
from paraplan.hardware_profiles import load_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.job import TrainingJob
from paraplan.planner.json_schema import schema_errors, validate_instance
from paraplan.planner.plan import Plan, config_at, estimate_at, plan_schema, plan_to_json
from paraplan.planner.search import search


@pytest.fixture(scope="module")
def schema():
    return plan_schema()


def _plans(count: int):
    cluster = load_cluster("dgx-h100", num_gpus=16)
    job = TrainingJob(model=load_model("llama-3.1-8b"), seq_len=4096, global_batch=64)
    result = search(job, cluster)
    documents = []
    for rank, row in enumerate(result.ranked[:count], start=1):
        row = int(row)
        plan = Plan(
            job=job,
            cluster=cluster,
            config=config_at(result.table, row),
            estimate=estimate_at(result.estimates, row),
            fits=True,
            rank=rank,
        )
        documents.append(plan_to_json(plan, result.estimates.cost_model))
    return documents


@pytest.fixture(scope="module")
def plans():
    return _plans(5)


@pytest.fixture
def plan(plans):
    return copy.deepcopy(plans[0])


def test_real_plans_validate(plans, schema):
    assert len(plans) == 5
    for document in plans:
        assert schema_errors(document, schema) == []
        validate_instance(document, schema)
        # Plain JSON: no numpy scalars, survives a round trip unchanged.
        assert json.loads(json.dumps(document)) == document
        assert schema_errors(json.loads(json.dumps(document)), schema) == []


def test_plan_content(plan):
    assert plan["schema_version"] == 1
    assert plan["rank"] == 1
    config = plan["config"]
    assert config["tp"] * config["pp"] * config["dp"] * config["cp"] == plan["cluster"]["num_gpus"] == 16
    assert set(config) == {"tp", "pp", "dp", "cp", "cp_comm", "ep", "etp", "vpp", "mbs", "zero", "recompute", "sp",
                           "ep_overlap", "offload", "pp_schedule", "tp_overlap"}
    est = plan["estimate"]
    assert sum(est["step_time_breakdown_s"].values()) == pytest.approx(est["step_time_s"], rel=1e-9)
    assert est["tokens_per_s"] == pytest.approx(64 * 4096 / est["step_time_s"], rel=1e-12)
    assert 0 < est["mfu"] <= est["hfu"] < 1


def _errors_for(plan, schema):
    errors = schema_errors(plan, schema)
    assert errors, "expected a violation"
    return errors


def test_missing_required_key(plan, schema):
    del plan["config"]["tp"]
    errors = _errors_for(plan, schema)
    assert any(e.startswith("$.config") and "'tp'" in e and "missing" in e for e in errors), errors


def test_missing_top_level_key(plan, schema):
    del plan["fits"]
    assert any(e.startswith("$") and "'fits'" in e and "missing" in e for e in _errors_for(plan, schema))


@pytest.mark.parametrize(
    "path, value, expected_path",
    [
        (("config", "tp"), "2", "$.config.tp"),
        (("config", "tp"), True, "$.config.tp"),
        (("config", "sp"), 1, "$.config.sp"),
        (("estimate", "step_time_s"), "fast", "$.estimate.step_time_s"),
        (("model", "name"), 7, "$.model.name"),
        (("fits",), "yes", "$.fits"),
        (("placement",), [], "$.placement"),
    ],
)
def test_wrong_type(plan, schema, path, value, expected_path):
    target = plan
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    errors = _errors_for(plan, schema)
    assert any(e.startswith(expected_path + ":") and "expected" in e for e in errors), errors


def test_unknown_key(plan, schema):
    plan["config"]["pipeline_degree"] = 4
    errors = _errors_for(plan, schema)
    assert any(e.startswith("$.config:") and "pipeline_degree" in e for e in errors), errors
    del plan["config"]["pipeline_degree"]
    plan["extra"] = 1
    assert any(e.startswith("$:") and "extra" in e for e in _errors_for(plan, schema))


@pytest.mark.parametrize(
    "path, value, expected_path",
    [
        (("job", "precision"), "fp32", "$.job.precision"),
        (("job", "engine"), "colossal", "$.job.engine"),
        (("config", "recompute"), "some", "$.config.recompute"),
        (("config", "zero"), 4, "$.config.zero"),
        (("estimate", "peak_memory_stage"), "second", "$.estimate.peak_memory_stage"),
    ],
)
def test_enum_violation(plan, schema, path, value, expected_path):
    plan[path[0]][path[1]] = value
    errors = _errors_for(plan, schema)
    assert any(e.startswith(expected_path + ":") and repr(value) in e for e in errors), errors


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_numbers_are_violations(plan, schema, bad):
    plan["estimate"]["step_time_s"] = bad
    errors = schema_errors(plan, schema)
    assert any(e.startswith("$.estimate.step_time_s:") for e in errors), errors
    # What would be written is not JSON.
    with pytest.raises(ValueError):
        json.dumps(plan, allow_nan=False)


def test_const_and_minimum(plan, schema):
    plan["schema_version"] = 2
    plan["rank"] = 0
    plan["estimate"]["step_time_breakdown_s"]["bubble_s"] = -1.0
    errors = _errors_for(plan, schema)
    assert any(e.startswith("$.schema_version:") for e in errors), errors
    assert any(e.startswith("$.rank:") and "minimum" in e for e in errors), errors
    assert any(e.startswith("$.estimate.step_time_breakdown_s.bubble_s:") for e in errors), errors


def test_validate_instance_names_the_first_violation(plan, schema):
    plan["config"]["tp"] = "2"
    plan["job"]["precision"] = "fp32"
    with pytest.raises(InputError, match=r"my-plan.json does not match the plan schema: .*\(and 1 more\)"):
        validate_instance(plan, schema, origin="my-plan.json")


def test_unsupported_schema_keyword_is_an_error():
    with pytest.raises(ValueError, match="pattern"):
        schema_errors("x", {"type": "string", "pattern": "^x$"})


def test_small_schemas():
    schema = {
        "type": "object",
        "required": ["a"],
        "additionalProperties": False,
        "properties": {
            "a": {"type": "array", "items": {"type": "integer", "maximum": 3}},
            "b": {"type": ["string", "null"]},
        },
    }
    assert schema_errors({"a": [1, 2, 3]}, schema) == []
    assert schema_errors({"a": [], "b": None}, schema) == []
    assert schema_errors({"a": [1, 4]}, schema) == ["$.a[1]: 4 is above the maximum 3"]
    assert schema_errors({"a": [1, "x"]}, schema) == ["$.a[1]: expected integer, got str"]
    assert schema_errors({"a": [], "b": 1}, schema) == ["$.b: expected ['string', 'null'], got int"]
    assert schema_errors([], schema) == ["$: expected object, got list"]


# -- property: the checker never crashes ------------------------------------------------------------
JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
PLAN_KEYS = (
    "schema_version",
    "rank",
    "model",
    "cluster",
    "job",
    "config",
    "estimate",
    "fits",
    "placement",
    "provenance",
    "tp",
    "sp",
    "step_time_s",
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON_LIKE)
def test_random_values_never_crash(value):
    errors = schema_errors(value, plan_schema())
    assert isinstance(errors, list) and all(isinstance(e, str) for e in errors)
    if not isinstance(value, dict):
        assert errors  # a plan is an object


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(PLAN_KEYS), JSON_LIKE, max_size=8))
def test_random_plan_shaped_dicts_never_crash(value):
    errors = schema_errors(value, plan_schema())
    assert isinstance(errors, list) and errors  # random dicts always miss something required


_VALID_PLAN = _plans(1)[0]


def _paths(document, prefix=()):
    yield prefix
    if isinstance(document, dict):
        for key, item in document.items():
            yield from _paths(item, prefix + (key,))


_PLAN_PATHS = [p for p in _paths(_VALID_PLAN) if p]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_PLAN_PATHS), JSON_LIKE)
def test_mutated_plans_never_crash(path, value):
    document = copy.deepcopy(_VALID_PLAN)
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    errors = schema_errors(document, plan_schema())
    assert isinstance(errors, list)
    if errors:
        with pytest.raises(InputError):
            validate_instance(document, plan_schema())
    else:
        validate_instance(document, plan_schema())
