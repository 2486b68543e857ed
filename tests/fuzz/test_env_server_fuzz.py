"""Schemathesis against `horizonrl env-server`'s own OpenAPI schema: generated requests (valid and
invalid bodies, ids, actions) never get a 5xx, never crash the server, and responses match the
schema. Runs the real FastAPI app in-process over ASGI (no sockets)."""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from horizonrl.envpool.env_server import create_app

pytestmark = pytest.mark.fuzz

# A handful of ids exist so that some generated requests reach a live env, not only 404s.
APP = create_app("babyai", {}, max_envs=64)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
CASES: Counter[str] = Counter()
STATUS: Counter[int] = Counter()
EXAMPLES = 300  # per operation and phase; small bodies exhaust early, so the total is checked


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    total = sum(CASES.values())
    print(f"\nenv-server fuzz: {total} requests over {len(CASES)} operations; status codes "
          f"{dict(sorted(STATUS.items()))}")
    assert total >= 1000, total


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_5xx_and_schema_conformant(case):
    response = case.call()
    CASES[case.operation.label] += 1
    STATUS[response.status_code] += 1
    # 501 is /oracle on an env without one (not bad input); BabyAI has one, so none here.
    assert response.status_code < 500, (case.method, case.path, response.text[:500])
    # The server's types are strict on purpose ("3" or 327.0 are not ids), while JSON Schema
    # calls 327.0 an integer: that one check is left out; every other one (status codes and
    # bodies documented, content types, negative data rejected) runs.
    case.validate_response(response, excluded_checks=[positive_data_acceptance])
