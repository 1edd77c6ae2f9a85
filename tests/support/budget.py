"""The proof loop's budget, as a pytest plugin (tests/conftest.py loads it): a test whose setup and call together take
over BUDGET_S fails with a message naming the budget, unless it is marked `slow` with a reason, and a `slow` mark
without a reason is itself an error. docs/19.TESTING.md says how to write a test that fits.

The budget is a guard against growth, not a timing assertion: `scripts/flake-hunt` runs beside CPU hogs and scales it
with BLAZAR_TEST_BUDGET_SCALE, and BLAZAR_TEST_BUDGET_SCALE=0 turns it off (a debugger, a profiler)."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

BUDGET_S = 60.0
# What `slow` buys: a test marked with a reason may take this long before it fails in turn.
SLOW_BUDGET_S = 300.0

_SETUP_S = pytest.StashKey[float]()
# Seconds per test id, summed over its phases: in the process that reports (pytest-xdist sends workers' reports to
# the controller, which prints the summary).
_SPENT: dict[str, float] = {}


def _scale() -> float:
    raw = os.environ.get("BLAZAR_TEST_BUDGET_SCALE", "1")
    try:
        scale = float(raw)
    except ValueError:
        raise pytest.UsageError(f"BLAZAR_TEST_BUDGET_SCALE={raw!r}: expected a number (0 turns the budget off)") \
            from None
    if scale < 0:
        raise pytest.UsageError(f"BLAZAR_TEST_BUDGET_SCALE={raw!r}: expected a number >= 0")
    return scale


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slowest", type=int, default=0, metavar="N",
                     help="at the end, list the N slowest tests (setup, call and teardown together)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"slow(reason): may take up to {SLOW_BUDGET_S:.0f} s instead of {BUDGET_S:.0f} s "
                   "(tests/support/budget.py); the reason is required")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unexplained = [item.nodeid for item in items
                   if (mark := item.get_closest_marker("slow")) is not None
                   and not (mark.kwargs.get("reason") or (mark.args and mark.args[0]))]
    if unexplained:
        raise pytest.UsageError("@pytest.mark.slow needs a reason (@pytest.mark.slow(reason=\"...\")): "
                                + ", ".join(unexplained))


def budget_for(item: pytest.Item) -> float:
    return (SLOW_BUDGET_S if item.get_closest_marker("slow") else BUDGET_S) * _scale()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if call.when == "setup":
        item.stash[_SETUP_S] = call.duration
        return
    if call.when != "call" or not report.passed:
        return
    budget = budget_for(item)
    spent = item.stash.get(_SETUP_S, 0.0) + call.duration
    if budget and spent > budget:
        report.outcome = "failed"
        marked = item.get_closest_marker("slow") is not None
        report.longrepr = (
            f"over the test budget: {spent:.1f} s (setup and call) against {budget:.0f} s. "
            + ("Even a slow test has a ceiling: split it. " if marked else
               "Make it fit (docs/19.TESTING.md: share a daemon, use the fake engine for what does not need a real "
               "model, wait on events instead of sleeping) or mark it @pytest.mark.slow(reason=...). ")
            + "tests/support/budget.py")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SPENT[report.nodeid] = _SPENT.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    n = config.getoption("--slowest")
    if not n or not _SPENT:
        return
    terminalreporter.write_sep("=", f"the {min(n, len(_SPENT))} slowest tests (setup, call and teardown)")
    for nodeid, seconds in sorted(_SPENT.items(), key=lambda kv: -kv[1])[:n]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {nodeid}")
