"""One error tree: every exception class Blazar defines lives in blazar/errors.py, with a stable `code` and an
`http_status` as class attributes, and every refusal is a `Refused` that carries its reason, Retry-After and the
observations it relied on."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import blazar
from blazar import errors
from blazar.errors import BlazarError, QueueFull, Refused, exit_code_of


def _all_modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(blazar.__path__, "blazar.")]


def _tree() -> list[type[BlazarError]]:
    out, todo = [], [BlazarError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def test_every_exception_class_is_defined_in_the_error_tree() -> None:
    outside = []
    for name in _all_modules():
        module = importlib.import_module(name)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == name and name != "blazar.errors":
                outside.append(f"{name}.{cls_name}")
    assert outside == []


def test_every_error_has_a_stable_code_and_an_http_status() -> None:
    for name in _all_modules():
        importlib.import_module(name)
    for cls in _tree():
        assert isinstance(cls.code, str) and cls.code, cls
        assert isinstance(cls.http_status, int) and 400 <= cls.http_status <= 599, cls
        assert cls.__module__ == "blazar.errors", cls


def test_the_tree_is_drawn_in_the_module_docstring() -> None:
    doc = errors.__doc__ or ""
    missing = [cls.__name__ for cls in _tree() if cls.__name__ not in doc]
    assert missing == []


def test_a_refusal_carries_its_reason_retry_after_and_observations() -> None:
    e = QueueFull("64 waiting", retry_after_s=3.2, observations={"depth": 64})
    assert isinstance(e, Refused)
    assert (e.http_status, e.code, e.reason, e.retry_after_s, e.observations) == (
        429, "queue_full", "queue_full", 3.2, {"depth": 64})
    chosen = Refused("no", reason="model_not_allowed", http_status=403, error_type="permission_error")
    assert (chosen.http_status, chosen.code, chosen.error_type) == (403, "model_not_allowed", "permission_error")
    assert Refused.http_status == 503  # an instance's status is its own: the class keeps its default


def test_a_daemons_error_code_maps_to_the_exit_code_the_command_would_have_had() -> None:
    assert exit_code_of("circuit_open") == 10 and exit_code_of("model_not_loaded") == 9
    assert exit_code_of("model_pinned") == 6 and exit_code_of("no_such_code") == 1
