"""The fuzz budget was spent (runs after the other fuzz tests, see conftest.py)."""

from __future__ import annotations

import pytest

from tests.reliability.fuzz.checker import CI_EXAMPLES, TOTAL_EXAMPLES, WEIGHTS, Fuzz


def test_fuzz_case_count(fuzz: Fuzz) -> None:
    """The budget was spent: at least 90% of the examples ran (CI: >= 2,000 cases)."""
    ran = sum(fuzz.cases.values())
    if set(fuzz.cases) != set(WEIGHTS):
        pytest.skip(f"only some fuzz tests ran ({sorted(fuzz.cases)}): {ran} cases")
    assert ran >= 0.9 * TOTAL_EXAMPLES, (ran, TOTAL_EXAMPLES)
    if TOTAL_EXAMPLES >= CI_EXAMPLES:
        assert ran >= 2000
