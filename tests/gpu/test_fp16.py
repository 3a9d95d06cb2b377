"""fp16: ``mae pretrain`` with ``trainer.precision: 16-mixed`` (GPUs without bf16) on the default job's model
at 224 px: the fused AdamW, activation checkpointing, the run-health metrics and the non-finite guard, with
the gradients of one step made infinite. The loss scaler skips that step and halves the scale; nothing is
captured and the run ends with finite losses. Dry run: the tiny model at 32 px on the CPU, where Lightning
turns 16-mixed into bf16, so Lightning's fp16 ``MixedPrecision`` plugin is given itself (torch's
``GradScaler`` on the CPU)."""

import json
import math
from pathlib import Path

import lightning.pytorch as pl
import pytest

from tests.gpu.parts import LIMITS
from tests.gpu.smoke import SmokePart, callback
from tests.helpers import read_metrics
from tests.integration.pretrain.test_run_health import ScaleGradients

pytestmark = pytest.mark.timeout(LIMITS["fp16"][0])


class OptimizerRecord(pl.Callback):
    """Writes the optimizer's ``fused`` flag and the trainer's precision and loss scale to ``path`` (JSON)
    when training ends."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        record = {
            "fused_adamw": bool(trainer.optimizers[0].defaults.get("fused")),
            "precision": str(trainer.precision),
            "scaler": scaler is not None,
            "final_scale": scaler.get_scale() if scaler is not None else None,
            "steps": trainer.global_step,
        }
        self.path.write_text(json.dumps(record))


@pytest.fixture(scope="module")
def run(smoke: SmokePart) -> dict:
    """The fp16 run: its exit status, record, metrics rows and run folder."""
    steps, skipped = (6, 3) if smoke.dry_run else (30, 12)
    if smoke.dry_run:
        smoke.note("dry run: the tiny model at 32 px on the CPU, fp16 by Lightning's MixedPrecision plugin")
        precision = {
            "precision": None,
            "plugins": [
                {
                    "class_path": "lightning.pytorch.plugins.MixedPrecision",
                    "init_args": {"precision": "16-mixed", "device": "cpu"},
                }
            ],
        }
    else:
        precision = {"precision": "16-mixed"}
    record = smoke.work / "optimizer.json"
    callbacks = [
        callback(ScaleGradients, step=skipped, factor=float("inf")),
        callback(OptimizerRecord, path=str(record)),
    ]
    model = {**smoke.default_job_model(), "grad_checkpointing": True}
    data = smoke.digits(32 if smoke.dry_run else 224, 8 if smoke.dry_run else 64)
    config = smoke.pretrain_config("fp16", model, data, callbacks, max_steps=steps, max_epochs=-1)
    config["trainer"].update(precision, log_every_n_steps=1)
    config["checkpoint"] = {"save_top_k": 0}
    code, output = smoke.run_mae("run", "pretrain", "--config", str(smoke.write_config("fp16", config)))
    folder = next(iter(sorted((smoke.work / "runs" / "fp16").glob("version_*"))), None)
    rows = read_metrics(folder) if folder is not None and (folder / "metrics.csv").exists() else []
    scales, norms, ratios = (
        {int(r["step"]): float(r[f"train/{key}"]) for r in rows if r.get(f"train/{key}")}
        for key in ("loss_scale", "grad_norm", "update_ratio")
    )
    losses = [float(r["train/loss_step"]) for r in rows if r.get("train/loss_step")]
    done = json.loads(record.read_text()) if record.exists() else {}
    smoke.results.update(
        exit_status=code,
        steps=done.get("steps"),
        skipped_step=skipped,
        loss_scale_before=scales.get(skipped),
        loss_scale_after=scales.get(skipped + 1),
        fused_adamw=done.get("fused_adamw"),
        captured=folder is not None and (folder / "nonfinite").exists(),
        final_loss=losses[-1] if losses else None,
    )
    return {
        "code": code,
        "output": output[-2000:],
        "done": done,
        "losses": losses,
        "steps": steps,
        "grad_norms": norms,
        "update_ratios": ratios,
    }


def test_the_fp16_run_ends_with_finite_losses(run: dict) -> None:
    assert run["code"] == 0, run["output"]
    assert run["done"]["steps"] == run["steps"] and run["done"]["scaler"], run["done"]
    assert run["losses"] and all(math.isfinite(v) for v in run["losses"])


def test_the_skipped_step_halves_the_scale_and_is_not_captured(run: dict, smoke: SmokePart) -> None:
    assert smoke.results["loss_scale_after"] == smoke.results["loss_scale_before"] / 2, smoke.results
    assert not smoke.results["captured"]


def test_the_health_metrics_are_unscaled_and_show_the_skipped_step(run: dict, smoke: SmokePart) -> None:
    """train/grad_norm every step, unscaled (the fused AdamW unscales inside its step: divided by the scale
    here), inf on the skipped step, where train/update_ratio is 0."""
    skipped, norms, ratios = smoke.results["skipped_step"], run["grad_norms"], run["update_ratios"]
    assert sorted(norms) == list(range(run["steps"])), norms
    assert not math.isfinite(norms[skipped]) and ratios[skipped] == 0, (norms, ratios)
    others = [s for s in range(run["steps"]) if s != skipped]
    assert all(0 < norms[s] < 1e3 and 0 < ratios[s] < 1 for s in others), (norms, ratios)


def test_it_uses_the_fused_adamw(run: dict) -> None:
    assert run["done"]["fused_adamw"], run["done"]


def test_it_records_the_results(run: dict, smoke: SmokePart) -> None:
    """The results the docs read."""
    assert not smoke.missing_records("run"), smoke.missing_records("run")
