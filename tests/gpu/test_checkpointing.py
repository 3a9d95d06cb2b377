"""checkpointing: activation checkpointing (``model.grad_checkpointing``) on a ViT-L/16 pretraining step in
bf16 at 224 px, batch 64: CUDA's peak memory above the model, gradients and AdamW state (activation memory)
and the step time, without and with it (``benchmarks/memory.py``'s step and measurement; dry run: the tiny
model at 32 px, batch 2, fp32 on the CPU, its resident memory)."""

import pytest

from tests.gpu.parts import LIMITS
from tests.gpu.smoke import SmokePart

pytestmark = pytest.mark.timeout(LIMITS["checkpointing"][0])


@pytest.fixture(scope="module")
def measured(smoke: SmokePart) -> dict[bool, dict]:
    """``benchmarks.memory.measure_step`` of each setting, by ``grad_checkpointing``."""
    from benchmarks import memory

    if smoke.dry_run:
        smoke.note("dry run: the tiny model at 32 px, batch 2, 2 timed steps, fp32 on the CPU")
        case = dict(task="pretrain", model="tiny", img_size=32, batch_size=2, precision="fp32")
    else:
        case = dict(task="pretrain", model="ViT-L/16", img_size=224, batch_size=64, precision="bf16")
    rows = {}
    for checkpointing in (False, True):
        step = memory.build_step(**case, checkpointing=checkpointing, device=smoke.device)
        rows[checkpointing] = {**case, "grad_checkpointing": checkpointing}
        rows[checkpointing].update(memory.measure_step(step, steps=2, device=smoke.device))
        del step
        print(rows[checkpointing], flush=True)
    off, on = rows[False], rows[True]
    smoke.results.update(
        rows=list(rows.values()),
        activation_saved=round(1 - on["activation_mib"] / max(off["activation_mib"], 1), 3),
        time_added=round(on["step_s"] / off["step_s"] - 1, 3),
    )
    return rows


def test_checkpointing_lowers_the_activation_memory(measured: dict[bool, dict], smoke: SmokePart) -> None:
    if smoke.dry_run:  # a tiny model's activations are within the resident memory's noise
        assert all(row["step_s"] > 0 for row in measured.values())
    else:
        assert measured[True]["activation_mib"] < measured[False]["activation_mib"]


def test_it_records_the_results(measured: dict[bool, dict], smoke: SmokePart) -> None:
    """The results the docs read."""
    assert not smoke.missing_records(), smoke.missing_records()
