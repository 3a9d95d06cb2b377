"""ema: ``mae finetune --ema.decay`` on the GPU (bf16-mixed, the fused AdamW), the default job's encoder at
224 px from scratch on the built-in digits: ``val/acc1_ema`` logged, the EMA in the checkpoint at the last
step; then the EMA's cost per step (``benchmarks/ema_cost.py``'s measurement, ViT-B/16, batch 64). Dry run:
the tiny model at 32 px on the CPU, and the cost of the tiny ViT."""

import importlib.util

import pytest
import torch

from tests.gpu.parts import LIMITS
from tests.gpu.smoke import CSV_LOGGER, SmokePart
from tests.helpers import REPO, read_metrics

pytestmark = pytest.mark.timeout(LIMITS["ema"][0])


@pytest.fixture(scope="module")
def run(smoke: SmokePart) -> dict:
    """The fine-tuning run with the EMA: exit status, output, metrics rows and last checkpoint's EMA step."""
    steps = 6 if smoke.dry_run else 40
    if smoke.dry_run:
        smoke.note("dry run: the tiny model at 32 px on the CPU; the cost of a tiny ViT step")
    encoder = smoke.default_job_model()
    config = {
        "seed_everything": 0,
        "model": {
            "encoder": {"model": encoder["model"], "model_kwargs": encoder.get("model_kwargs")},
            "optim": {"warmup_epochs": 0},
        },
        "data": smoke.digits(32 if smoke.dry_run else 224, 8 if smoke.dry_run else 64),
        "trainer": {
            "accelerator": smoke.accelerator,
            "devices": 1,
            "precision": smoke.precision,
            "max_steps": steps,
            "max_epochs": -1,
            "limit_val_batches": 2,
            "val_check_interval": steps,
            "num_sanity_val_steps": 0,
            "enable_progress_bar": False,
            "logger": {"class_path": CSV_LOGGER, "init_args": {"save_dir": str(smoke.work / "runs")}},
        },
        "ema": {"decay": 0.999},
    }
    code, output = smoke.run_mae("run", "finetune", "--config", str(smoke.write_config("ema", config)))
    folder = next(iter(sorted((smoke.work / "runs").glob("*/version_*"))), None)
    rows = read_metrics(folder) if folder is not None and (folder / "metrics.csv").exists() else []
    last = next(iter(sorted((smoke.work / "runs").glob("*/version_*/checkpoints/last.ckpt"))), None)
    callbacks = torch.load(last, map_location="cpu", weights_only=False)["callbacks"] if last else {}
    state = callbacks.get("EMA", {})
    acc = [float(r["val/acc1_ema"]) for r in rows if r.get("val/acc1_ema")]
    smoke.results.update(
        exit_status=code, steps=steps, ema_step=state.get("step"), val_acc1_ema=acc[-1] if acc else None
    )
    return {"code": code, "output": output[-2000:], "steps": steps}


def test_the_ema_run_logs_its_accuracy_and_saves_its_average(run: dict, smoke: SmokePart) -> None:
    assert run["code"] == 0, run["output"]
    assert smoke.results["val_acc1_ema"] is not None, run["output"]
    assert smoke.results["ema_step"] == run["steps"]


def test_the_cost_of_the_ema_per_step(smoke: SmokePart) -> None:
    spec = importlib.util.spec_from_file_location("ema_cost", REPO / "benchmarks" / "ema_cost.py")
    ema_cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ema_cost)
    if smoke.dry_run:
        cost = ema_cost.measure("vit_tiny_patch16_224", 32, 2, 2, torch.device("cpu"))
    else:
        cost = ema_cost.measure("vit_base_patch16_224", 224, 64, 10, torch.device("cuda"))
    smoke.results["ema_cost"] = cost
    smoke.results["ema_ratio"] = cost["ema_ratio"]
    assert cost["ema_update_ms"] > 0
