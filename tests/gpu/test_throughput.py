"""throughput: the ViT-B/16 bf16 training step, ours with the default settings against Hugging Face's ViTMAE
variants, interleaved, 2 rounds (``benchmarks/throughput.py``; dry run: the CIFAR-size model at batch 2,
torch.compile turned off)."""

import pytest
import torch

from tests.gpu.parts import LIMITS
from tests.gpu.smoke import SmokePart

pytestmark = pytest.mark.timeout(LIMITS["throughput"][0])


@pytest.fixture(scope="module")
def rows(smoke: SmokePart) -> list[dict]:
    """The benchmark's rows: one per contender and round."""
    from benchmarks import throughput

    if smoke.dry_run:
        smoke.note("dry run: the CIFAR-size model at batch 2 on the CPU; torch.compile disabled (eager)")
        argv = ["--configs", "cifar", "--batch-size", "2", "--warmup", "0", "--steps", "1"]
    else:
        argv = ["--configs", "base224", "--batch-size", "256", "--warmup", "2", "--steps", "5"]
    argv += ["--device", smoke.device, "--variants", "peers", "default", "--rounds", "2", "--no-memory"]
    print("benchmarks/throughput.py " + " ".join(argv), flush=True)
    # compiling would take a minute on 2 cores: in the dry run "ours default" runs eagerly
    with torch._dynamo.config.patch(disable=smoke.dry_run):
        rows = throughput.main(argv)
    smoke.results.update(argv=argv, rows=rows, config=rows[0]["config"], batch_size=rows[0]["batch_size"])
    return rows


def test_ours_with_the_default_settings_against_hugging_faces_best(
    rows: list[dict], smoke: SmokePart
) -> None:
    ours = [r for r in rows if r["contender"].startswith("ours default")]
    hf = [r for r in rows if r["impl"] == "hf"]
    assert ours and hf, f"contenders measured: {sorted({r['contender'] for r in rows})}"
    best = max(hf, key=lambda r: r["img_s"])
    smoke.results.update(
        ours_default={
            "contender": ours[0]["contender"],
            "img_s": ours[0]["img_s"],
            "memory_mib": ours[0].get("memory_mib"),
        },
        hf_best={
            "contender": best["contender"],
            "img_s": best["img_s"],
            "memory_mib": best.get("memory_mib"),
        },
        ours_vs_hf_best=ours[0]["img_s"] / best["img_s"],
    )


def test_every_contender_trains(rows: list[dict]) -> None:
    stalled = [f"{r['contender']}: {r['img_s']} img/s" for r in rows if not r["img_s"] > 0]
    assert not stalled, stalled


def test_it_records_the_results(rows: list[dict], smoke: SmokePart) -> None:
    """The results the docs read."""
    assert not smoke.missing_records(), smoke.missing_records()
