"""detect: ``mae detect`` with the COCO ViTDet recipe's model (a random ViT-B encoder) in bf16 for 30 steps on
the built-in digit scenes, one epoch, so that its validation (mAP) runs too (dry run: the recipe's model
settings on a 2-block 32-wide ViT, fp32 on the CPU)."""

import math

import pytest
import yaml

from tests.gpu.callbacks import RunRecord, read_events
from tests.gpu.parts import LIMITS
from tests.gpu.smoke import CSV_LOGGER, SmokePart, callback
from tests.helpers import REPO, TINY_KWARGS, read_metrics

pytestmark = pytest.mark.timeout(LIMITS["detect"][0])
RECIPES = REPO / "mae" / "configs" / "detect"
DRY_RUN_MODEL = dict(
    encoder=dict(checkpoint=None, model="mae_vit_tiny_patch4", model_kwargs={**TINY_KWARGS, "depth": 2}),
    window_size=4,
    global_blocks=[1],
    out_channels=16,
    head_channels=16,
    rois_per_image=16,
    proposals_per_image=50,
    scales=[2, 1, 0.5, 0.25],
)


@pytest.fixture(scope="module")
def output(smoke: SmokePart) -> str:
    """The whole part (under the first test's time limit): ``mae detect``'s output; what it logged is in
    the results."""
    config, steps = _config(smoke)
    code, output = smoke.run_mae("detect", "detect", "--config", str(smoke.write_config("detect", config)))
    events = read_events(smoke.work / "run.jsonl")
    start = next((e for e in events if e["event"] == "train_start"), {})
    end = next((e for e in events if e["event"] == "train_end"), {})
    metrics = smoke.work / "runs" / "detect" / "version_0"
    rows = read_metrics(metrics) if (metrics / "metrics.csv").exists() else []
    losses = [float(r["train/loss_step"]) for r in rows if r.get("train/loss_step")]
    maps = [float(r["val/map"]) for r in rows if r.get("val/map")]
    smoke.results.update(
        exit_status=code,
        expected_steps=steps,
        precision=start.get("precision"),
        device=start.get("device"),
        steps=end.get("step"),
        losses=losses,
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
        val_map=maps[-1] if maps else None,
        seconds_training=end["time"] - start["time"] if start and end else None,
    )
    return output


def _config(smoke: SmokePart) -> tuple[dict, int]:
    """The recipe's model (a random encoder: no download) on the digit scenes; the number of steps."""
    recipe = yaml.safe_load((RECIPES / "coco_vitdet_base_mask_rcnn.yaml").read_text())
    scenes = yaml.safe_load((RECIPES / "default.yaml").read_text())["data"]
    model = {**recipe["model"], "encoder": {"checkpoint": None}}
    if smoke.dry_run:
        smoke.note(
            "dry run: the recipe's model settings on a 2-block 32-wide ViT (window 4, global block 1, 16 "
            "channels), 64 px, batch 2, 2 steps, fp32 on the CPU"
        )
        model.update(DRY_RUN_MODEL)
        steps, batch, img_size, workers, val_batches = 2, 2, 64, 0, 1
    else:
        steps, batch, img_size, workers, val_batches = 30, 16, 256, 4, 2
    smoke.results.update(
        encoder=model["encoder"].get("model", "mae_vit_base_patch16 (the recipe's default)"),
        window_size=model["window_size"],
        global_blocks=model["global_blocks"],
        relative_position=model["relative_position"],
        img_size=img_size,
        batch_size=batch,
        grad_checkpointing=model["grad_checkpointing"],
    )
    init = {
        **scenes["init_args"],
        "root": str(smoke.work / "digit_scenes"),
        "num_train": steps * batch,
        "num_val": val_batches * batch,
        "img_size": img_size,
        "batch_size": batch,
        "num_workers": workers,
    }
    logger = {"class_path": CSV_LOGGER, "init_args": {"save_dir": str(smoke.work / "runs"), "name": "detect"}}
    trainer = {
        **recipe["trainer"],
        "accelerator": smoke.accelerator,
        "devices": 1,
        "strategy": "auto",
        "precision": "32-true" if smoke.dry_run else recipe["trainer"]["precision"],
        "max_steps": steps,
        "limit_val_batches": val_batches,
        "num_sanity_val_steps": 0,
        "log_every_n_steps": 1,
        "enable_progress_bar": False,
        "logger": logger,
        "callbacks": [callback(RunRecord, path=str(smoke.work / "run.jsonl"))],
    }
    config = {
        "seed_everything": 0,
        "model": model,
        "data": {"class_path": scenes["class_path"], "init_args": init},
        "trainer": trainer,
        "checkpoint": {**recipe.get("checkpoint", {}), "dirpath": str(smoke.work / "ckpts")},
        "figures": {"every_n_epochs": 0},
    }
    return config, steps


def test_mae_detect_trains_the_recipes_model_on_the_device(output: str, smoke: SmokePart) -> None:
    results = smoke.results
    assert results["exit_status"] == 0, f"mae detect exited with {results['exit_status']}: {output[-1500:]}"
    assert results["steps"] == results["expected_steps"], f"trained {results['steps']} steps"
    assert str(results["device"]).startswith(smoke.device), f"trained on {results['device']}"


def test_the_training_losses_are_finite(output: str, smoke: SmokePart) -> None:
    losses = smoke.results["losses"]
    assert losses and all(math.isfinite(v) for v in losses), (
        f"training losses missing or not finite: {losses[:10]}"
    )


def test_validation_logs_a_map(output: str, smoke: SmokePart) -> None:
    assert smoke.results["val_map"] is not None, "no val/map logged"


def test_it_records_the_results_and_logs(output: str, smoke: SmokePart) -> None:
    """The results the docs read, and each command's log."""
    assert not smoke.missing_records("detect"), smoke.missing_records("detect")
