"""The suite's tiers and shared fixtures.

The tests follow the package: ``unit/<layer>/test_<module>.py`` tests ``mae/<layer>/<module>.py`` in this
process; ``integration/<area>/`` runs the ``mae`` command end to end (forked or fresh processes, training
runs, signals); ``docs/`` checks the pages, README and CHANGELOG against the code; ``gpu/`` is the GPU smoke
check; ``suite/`` tests this machinery.

Tiers (markers registered in pyproject.toml) follow the folder: everything under ``integration/`` is
``slow``, and so is a test marked ``ddp``, ``two_nodes``, ``gpu``, ``browser`` or ``s3`` (the ``browser``
and ``s3`` fixtures mark the tests that use them). The fast tier, ``-m "not slow"``, is ``unit/``,
``docs/`` and ``suite/`` less what is marked slow by hand; a fast-tier test that starts a fresh Python
interpreter anyway fails, naming the fix.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from mae.models import MaskedAutoencoderViT  # noqa: E402
from tests.helpers import TINY  # noqa: E402

TESTS = Path(__file__).resolve().parent
# Folders whose every test is slow.
SLOW_FOLDERS = ("integration",)
# A fixture of this name marks the tests that use it.
FIXTURE_MARKERS = {"browser": "browser", "s3": "s3"}
# These markers leave a test out of the fast tier too.
SLOW_MARKERS = ("ddp", "two_nodes", "browser", "s3", "gpu")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in item.fixturenames:
                item.add_marker(marker)
        if _in_slow_folder(item) or any(item.get_closest_marker(m) for m in SLOW_MARKERS):
            item.add_marker("slow")


def _in_slow_folder(item: pytest.Item) -> bool:
    path = Path(str(item.path)).resolve()
    return path.is_relative_to(TESTS) and path.relative_to(TESTS).parts[0] in SLOW_FOLDERS


@pytest.fixture(autouse=True)
def _fresh_interpreters_only_in_slow_tests(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a test not marked ``slow``, starting ``python`` fails naming the fix: the fast tier stays free of
    interpreter start-ups."""
    if request.node.get_closest_marker("slow"):
        return
    popen_init = subprocess.Popen.__init__

    def guarded_init(self, args, *more, **kwargs):
        program = args[0] if isinstance(args, list | tuple) else args
        if str(program) == sys.executable:
            raise RuntimeError(
                f"{request.node.nodeid} starts a fresh Python interpreter ({args!r}) but is not marked slow: "
                "run the command with tests.helpers.run_mae (a forked child of the preloaded server), "
                "or put the test under tests/integration/ (or mark it @pytest.mark.slow) if it is about the "
                "process itself"
            )
        popen_init(self, args, *more, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_init)


@pytest.fixture
def tiny_model() -> MaskedAutoencoderViT:
    torch.manual_seed(0)
    return MaskedAutoencoderViT(**TINY).eval()
