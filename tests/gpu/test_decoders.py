"""decoders: every decoder switch (partial reconstruction, the cross decoder, low resolution, the fast recipe)
for 50 timed steps each on ViT-B/16 (``benchmarks/time_to_quality.py --throughput-only``; dry run: the tiny
model at 32 px, batch 2, 1 timed step per round)."""

import json

import pytest

from tests.gpu.parts import LIMITS
from tests.gpu.smoke import SmokePart
from tests.helpers import TINY_KWARGS

pytestmark = pytest.mark.timeout(LIMITS["decoders"][0])
ROUNDS = 2


@pytest.fixture(scope="module")
def img_s(smoke: SmokePart) -> dict[str, float]:
    """Images per second of each measured variant."""
    from benchmarks import time_to_quality

    if smoke.dry_run:
        smoke.note("dry run: the tiny model at 32 px, batch 2, 1 timed step per round")
        size = [
            "--model",
            "mae_vit_tiny_patch4",
            "--model-kwargs",
            json.dumps(TINY_KWARGS),
            "--img-size",
            "32",
        ]
        steps = ["--batch-size", "2", "--warmup", "1", "--steps", "1"]
    else:
        size = ["--model", "mae_vit_base_patch16", "--img-size", "224"]
        steps = ["--batch-size", "256", "--warmup", "3", "--steps", "25"]
    argv = ["--throughput-only", "--device", smoke.device, "--rounds", str(ROUNDS), *size, *steps]
    print("benchmarks/time_to_quality.py " + " ".join(argv), flush=True)
    rows = time_to_quality.main(argv)
    img_s = {r["variant"]: r["img_s"] for r in rows}
    smoke.results.update(argv=argv, timed_steps_per_variant=int(steps[-1]) * ROUNDS, rows=rows, img_s=img_s)
    return img_s


def test_every_single_size_variant_is_measured(img_s: dict[str, float]) -> None:
    from benchmarks import time_to_quality

    single_size = {name for name, variant in time_to_quality.VARIANTS.items() if not variant.phases}
    assert not single_size - set(img_s), f"variants not measured: {sorted(single_size - set(img_s))}"


def test_every_variant_trains(img_s: dict[str, float]) -> None:
    stalled = [f"{name}: {value} img/s" for name, value in img_s.items() if not value > 0]
    assert not stalled, stalled


def test_it_records_the_results(img_s: dict[str, float], smoke: SmokePart) -> None:
    """The results the docs read."""
    assert not smoke.missing_records(), smoke.missing_records()
