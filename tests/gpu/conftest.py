"""The ``smoke`` fixture every part's tests share, and the parts' time limits.

Each part's tests run twice: on the GPU (marked ``gpu``, which implies ``slow``; skipped without CUDA) and
as the dry run on the CPU with tiny sizes (marked ``slow``), so a broken part fails here and not on the
next lent GPU. A part's ``pytest.mark.timeout`` is its limit on the GPU; the dry run and the environment
(``GPU_SMOKE_LIMIT_<PART>``) replace it here.
"""

import gc
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.gpu.parts import part_of, time_limits
from tests.gpu.smoke import STARTED_PARTS, SmokePart

MODES = [
    pytest.param(
        "cuda",
        id="gpu",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
    ),
    pytest.param("cpu", id="dry_run", marks=pytest.mark.slow),
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        part = part_of(item.path)
        mode = getattr(item, "callspec", None) and item.callspec.params.get("smoke")
        if part is None or mode is None:
            continue
        limit, _ = time_limits(part, dry_run=mode == "cpu")
        item.add_marker(
            pytest.mark.timeout(limit), append=False
        )  # before the module's own: pytest-timeout reads it


@pytest.fixture(scope="module", params=MODES)
def smoke(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmokePart]:
    """The part of the requesting test module, on the GPU or in the dry run; skipped when it no longer fits
    before the smoke check's deadline (``--smoke-deadline``)."""
    part, dry_run = part_of(request.path), request.param == "cpu"
    _skip_without_time_left(request.config, part, dry_run)
    work = tmp_path_factory.mktemp(part)
    logs = request.config.getoption("json_out", default=None) or work
    smoke = SmokePart(part, dry_run, work=work, logs=Path(logs))
    request.config.stash.setdefault(STARTED_PARTS, {})[part] = smoke
    print(f"== {part} ({'dry run, ' if dry_run else ''}device {smoke.device})", flush=True)
    yield smoke
    if torch.cuda.is_initialized():  # the next part's commands need the memory this process cached
        gc.collect()
        torch.cuda.empty_cache()


def _skip_without_time_left(config: pytest.Config, part: str, dry_run: bool) -> None:
    deadline = config.getoption("smoke_deadline", default=None)
    if deadline is None:
        return
    _, least = time_limits(part, dry_run)
    left = deadline - time.time()
    if left < least:
        pytest.skip(f"{left:.0f} s left before the deadline, the part needs at least {least:.0f} s")
