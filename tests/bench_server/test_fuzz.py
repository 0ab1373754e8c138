"""API fuzzing, on SQLite and on PostgreSQL: no input gets a 5xx, every answer conforms to the OpenAPI schema.

1. Schemathesis over the app's own OpenAPI schema (every operation, positive and negative generation, with the
   token): checks `not_a_server_error`, `status_code_conformance`, `content_type_conformance` and
   `response_schema_conformance`. `positive_data_acceptance` is left out on purpose: the schema of a sweep spec is
   looser than the spec model (duplicates, limits, mode options and the grid size are checked by validators the
   schema cannot express), so a schema-valid body may rightly get 422.
2. Hypothesis strategies over the spec model, where the schema is that loose: near-valid sweep specs with hostile
   values in every field (NaN and Infinity, integers past int64, booleans for numbers, NUL characters, markup,
   huge lists) must get 201, 413 or 422, with a body that is valid JSON.

Seeds and example counts are fixed (`derandomize`), so CI runs the same cases every time. The number of cases run
and of 5xx answers is printed (`-s`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

TOKEN = "fuzz-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES = 15  # per operation and generation mode
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                     suppress_health_check=list(HealthCheck))


@pytest.fixture(params=["sqlite", "postgresql"])
def app(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from bench_server.core.config import ServerSettings
    from bench_server.main import create_app
    from db.migrate import upgrade
    from db.session import dispose_engine

    monkeypatch.setenv("CPBENCH_MAX_POINTS_PER_SWEEP", "64")  # a fuzzed grid stays small
    from runners.settings import get_worker_settings

    get_worker_settings.cache_clear()
    database = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'fuzz.db'}"
    else:
        from tests.utils.postgres import ScratchDatabase

        database = ScratchDatabase("cpbench_fuzz")
        url = database.url
    upgrade(url)
    try:
        yield create_app(ServerSettings(DATABASE_URL=url, API_TOKEN=TOKEN))
    finally:
        dispose_engine(url)
        if database is not None:
            database.drop()
        get_worker_settings.cache_clear()


def test_schemathesis_finds_no_5xx_and_no_schema_violation(app: Any) -> None:
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app)
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) >= 8
    counts = {"cases": 0, "5xx": 0}
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @_SETTINGS
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case: Any) -> None:
                counts["cases"] += 1
                response = case.call(headers=AUTH)
                counts["5xx"] += response.status_code >= 500
                case.validate_response(response, checks=CHECKS)

            try:
                run()
            except Unsatisfiable:
                assert mode == GenerationMode.NEGATIVE  # an operation without parameters has no invalid request
    print(f"schemathesis: {counts['cases']} cases, {counts['5xx']} answers 5xx")
    assert counts["5xx"] == 0 and counts["cases"] >= 8 * EXAMPLES


# -- Hypothesis over the spec model --------------------------------------------------------------------------------

_HOSTILE_NUMBERS = st.sampled_from([math.nan, math.inf, -math.inf, 2**63, 2**64 + 1, -(2**70), True, False, 0, -1,
                                    1e308, 2**31, 2**40, "1", None])
_HOSTILE_TEXT = st.sampled_from(["a\x00b", "[/oops] markup", "[bold]x[/bold]", "", "x" * 300, "</script><script>",
                                 "'; DROP TABLE points; --", "\u202e", "ok"])
_VALID = {"name": "fuzz", "ops": ["gdn"], "modes": ["none"], "backends": ["torch"],
          "axes": {"B": 1, "T": [64], "H": 2, "K": 16, "V": 16, "lb": -1.0, "W": 1, "dtype": "float32"}}
_NUMERIC_FIELDS = [("axes", "B"), ("axes", "T"), ("axes", "H"), ("axes", "K"), ("axes", "V"), ("axes", "lb"), ("axes", "W"),
                   ("timing", "min_samples"), ("timing", "max_samples"), ("timing", "min_time_s"), ("timing", "timeout_s"),
                   ("timing", "max_rel_iqr"), ("timing", "warmup_s"), (None, "seeds"), (None, "repetitions"),
                   (None, "max_attempts"), ("check", "tol_none"), ("check", "reference_tokens"), ("warmup_correct", "tol"),
                   ("tuning", "budget")]
_TEXT_FIELDS = [(None, "name"), (None, "tags"), (None, "modes"), (None, "ops"), ("axes", "layout"), ("axes", "dtype"),
                ("mode_options", "ring")]


@st.composite
def hostile_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec = json.loads(json.dumps(_VALID))
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            section, key = draw(st.sampled_from(_NUMERIC_FIELDS))
            value: Any = draw(_HOSTILE_NUMBERS)
        else:
            section, key = draw(st.sampled_from(_TEXT_FIELDS))
            value = draw(_HOSTILE_TEXT)
        if draw(st.booleans()):
            value = [value] * draw(st.integers(1, 3))
        (spec.setdefault(section, {}) if section else spec)[key] = value
    return spec


def test_hostile_spec_values_get_a_4xx_with_valid_json(app: Any) -> None:
    from fastapi.testclient import TestClient

    counts = {"cases": 0, "5xx": 0}
    with TestClient(app, raise_server_exceptions=False) as client:

        @settings(_SETTINGS, max_examples=80)
        @given(spec=hostile_specs())
        def run(spec: dict[str, Any]) -> None:
            counts["cases"] += 1
            body = json.dumps(spec, allow_nan=True)  # NaN/Infinity literals, as a hostile client sends them
            r = client.post("/api/v1/sweeps", content=body, headers={**AUTH, "Content-Type": "application/json"})
            counts["5xx"] += r.status_code >= 500
            assert r.status_code in (201, 413, 422), (r.status_code, r.text[:500])
            json.loads(r.text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c} in the answer"))

        run()
    print(f"spec-model fuzz: {counts['cases']} cases, {counts['5xx']} answers 5xx")
    assert counts["5xx"] == 0
