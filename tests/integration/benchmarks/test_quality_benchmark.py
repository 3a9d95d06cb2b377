"""Smoke run of benchmarks/quality.py at tiny sizes (the real numbers live in README)."""

import json

import own_data
import pytest
import quality
import transfer
from PIL import Image

from tests.helpers import TINY_KWARGS

pytestmark = pytest.mark.slow  # each trains tiny models through a whole benchmark (13-29 s)


def test_quality_benchmark__tiny_run_writes_table_and_plots(tmp_path):
    table = quality.main(
        [
            "--seeds",
            "0",
            "--pretrain-epochs",
            "1",
            "--pretrain-warmup",
            "0",
            "--probe",
            "fast",
            "lars",
            "--probe-epochs",
            "1",
            "--finetune-epochs",
            "2",
            "--model-kwargs",
            json.dumps(TINY_KWARGS),
            "--batch-size",
            "128",
            "--out",
            str(tmp_path),
        ]
    )
    assert "| MAE-pretrained (1 epochs) |" in table and "| random init (from scratch) |" in table
    for name in ("results.md", "results.json", "pretrain_loss.png", "accuracy.png"):
        assert (tmp_path / name).stat().st_size > 0
    results = json.loads((tmp_path / "results.json").read_text())[0]
    assert set(results["mae"]) == {
        "kNN",
        "linear probe (fast)",
        "linear probe (LARS)",
        "fine-tune 10% labels",
        "fine-tune 100% labels",
    }
    assert all(0 <= v <= 100 for tag in ("mae", "random") for v in results[tag].values())


def test_own_data_benchmark__tiny_run_writes_results_and_figures(tmp_path):
    results = own_data.main(
        [
            "--out",
            str(tmp_path),
            "--epochs",
            "1",
            "--source-epochs",
            "1",
            "--finetune-epochs",
            "1",
            "--freeze-encoder-epochs",
            "0",
            "--images-per-class",
            "12",
        ]
    )
    pngs = sorted((tmp_path / "digits16" / "train" / "3").glob("*.png"))
    assert len(pngs) == 12 and Image.open(pngs[0]).mode == "I;16"
    for name in ("scratch", "init_from"):
        assert 0 <= results[name]["knn_acc1"] <= 100 and 0 <= results[name]["finetune_acc1"] <= 100
        assert (tmp_path / f"reconstructions_{name}.png").exists()
    assert (
        "adapted from 3 to 1 input channels" in next((tmp_path / "runs").rglob("init_from.txt")).read_text()
    )
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["epochs"] == 1


def tiny_transfer(checkpoint, tmp_path, *args: str) -> str:
    """``benchmarks/transfer.py`` of the encoder ``tiny`` (``checkpoint``) and a random one, 2 epochs a task
    on 16 training and 4 validation scenes, into ``tmp_path / "out"``; ``args`` (seeds, tasks) after. Its
    table."""
    return transfer.main(
        [
            "--encoders",
            f"tiny={checkpoint}",
            "--num-train",
            "16",
            "--num-val",
            "4",
            "--segment-epochs",
            "2",
            "--detect-epochs",
            "2",
            "--scenes",
            str(tmp_path / "scenes"),
            "--out",
            str(tmp_path / "out"),
            *args,
        ]
    )


def test_transfer_benchmark__tiny_run_compares_pretrained_and_random_encoders(tmp_path, monkeypatch):
    from tests.helpers import tiny_pretraining_checkpoint

    checkpoint = tiny_pretraining_checkpoint(tmp_path / "pretrain")
    table = tiny_transfer(checkpoint, tmp_path, "--seeds", "0", "--tasks", "segment", "detect")
    for row in (
        "| segment | tiny | val/miou |",
        "| segment | random | val/miou |",
        "| detect | tiny | val/map |",
        "| detect | random | val/mask_map |",
    ):
        assert row in table
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert all(
        0 <= run[m] <= 1
        for task in results.values()
        for runs in task.values()
        for run in runs
        for m in run
        if m != "seconds"
    )
    assert (tmp_path / "out" / "detect_tiny_seed0.png").exists()

    # the same command line again reuses the finished runs; another seed is trained
    trained = []
    train, *rest = transfer.TASKS["detect"]
    monkeypatch.setitem(transfer.TASKS, "detect", (lambda argv: trained.append(argv) or train(argv), *rest))
    again = tiny_transfer(checkpoint, tmp_path, "--seeds", "0", "1", "--tasks", "detect")
    assert [argv[argv.index("--seed_everything") + 1] for argv in trained] == ["1", "1"]  # tiny and random
    first = [line for line in table.splitlines() if line.startswith("| detect | tiny | val/map |")][0]
    assert f"| {first.split('|')[5].strip()}, " in again  # seed 0's value, reused, then seed 1's
