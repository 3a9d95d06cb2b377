"""The suite's tiers and shared fixtures.

Tiers (markers registered in pyproject.toml): a test that starts a fresh Python interpreter
(``subprocess.Popen`` / ``helpers.run_mae_process``: DDP, launchers, the interpreter's start-up) or starts a
command to signal it (``helpers.start_mae``: SIGKILL, SIGTERM to one process or its group) is marked
``slow`` here, as is one that uses the ``browser`` fixture (marked ``browser``) or the ``s3`` fixture (``s3``); ``ddp``
is marked by hand and implies ``slow``, as does ``gpu`` (the GPU smoke check in ``tests/gpu``).
Whatever calls lead there (the test, its helpers, its
fixtures) is read from the code, so a new test cannot forget. The fast tier is ``-m "not slow"``;
a test outside ``slow`` that starts an interpreter anyway (say through a library) fails, saying so.
"""

import os
import subprocess
import sys
import types

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from mae.models import MaskedAutoencoderViT  # noqa: E402
from tests.helpers import TINY  # noqa: E402

# A fixture of this name marks the tests that use it.
FIXTURE_MARKERS = {"browser": "browser", "s3": "s3"}
# These markers leave a test out of the fast tier too.
SLOW_MARKERS = ("ddp", "browser", "s3", "gpu")
# Names whose use starts a process the test waits on and signals: a fresh interpreter (subprocess.Popen, our
# helper around subprocess.run), or a forked command started in the background (start_mae).
PROCESS_STARTERS = frozenset({"Popen", "run_mae_process", "start_mae"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in item.fixturenames:
                item.add_marker(marker)
        starts_process = any(_reaches(func, PROCESS_STARTERS) for func in _functions_run_by(item))
        if starts_process or any(item.get_closest_marker(m) for m in SLOW_MARKERS):
            item.add_marker("slow")


def _functions_run_by(item: pytest.Item) -> list[types.FunctionType]:
    """The test function and the functions of every fixture it uses."""
    functions = [getattr(item, "function", None)]
    fixture_info = getattr(item, "_fixtureinfo", None)
    if fixture_info is not None:
        for name in item.fixturenames:
            for definition in fixture_info.name2fixturedefs.get(name, ()):
                functions.append(definition.func)
    return [f for f in functions if isinstance(f, types.FunctionType) and f is not _guard_function()]


def _guard_function() -> types.FunctionType:
    """The guard below names Popen to watch it, not to start it."""
    return _fresh_interpreters_only_in_slow_tests.__wrapped__


def _names_in(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_in(const)
    return names


def _reaches(func: types.FunctionType, names: frozenset[str], seen: set | None = None) -> bool:
    """Whether ``func`` names one of ``names``, itself or through the test code it calls by name
    (helpers, module-level ``_run`` / ``_start`` functions), transitively."""
    seen = set() if seen is None else seen
    if func in seen:
        return False
    seen.add(func)
    used = _names_in(func.__code__)
    if used & names:
        return True
    for name in used:
        callee = func.__globals__.get(name)
        if isinstance(callee, types.FunctionType) and _is_test_code(callee, func):
            if _reaches(callee, names, seen):
                return True
    return False


def _is_test_code(callee: types.FunctionType, caller: types.FunctionType) -> bool:
    """A function of the caller's own module or of the tests package, not of the project or a library."""
    return callee.__module__ == caller.__module__ or callee.__module__.split(".")[0] == "tests"


@pytest.fixture(autouse=True)
def _fresh_interpreters_only_in_slow_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a test not marked ``slow``, starting ``python`` fails naming the fix: the fast tier must stay
    free of interpreter start-ups the marking above did not see."""
    if request.node.get_closest_marker("slow"):
        return
    popen_init = subprocess.Popen.__init__

    def guarded_init(self, args, *more, **kwargs):
        program = args[0] if isinstance(args, list | tuple) else args
        if str(program) == sys.executable:
            raise RuntimeError(
                f"{request.node.nodeid} starts a fresh Python interpreter ({args!r}) but is not marked slow: "
                "run the command with tests.helpers.run_mae (a forked child of the preloaded server), "
                "or mark the test @pytest.mark.slow if it is about the process itself"
            )
        popen_init(self, args, *more, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_init)


@pytest.fixture
def tiny_model() -> MaskedAutoencoderViT:
    torch.manual_seed(0)
    return MaskedAutoencoderViT(**TINY).eval()
