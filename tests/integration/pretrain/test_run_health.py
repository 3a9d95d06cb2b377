"""Run health through ``mae pretrain``: the gradient norm and update ratio in the metrics on the logging
steps, and the warning on a gradient norm jump (the fp16 loss scale and a skipped fp16 step: the GPU smoke
part ``fp16``, tests/gpu/test_fp16.py, whose dry run is in the suite)."""

from pathlib import Path

import lightning.pytorch as pl

from tests.helpers import TINY_KWARGS, csv_logger, read_metrics, run_mae


class ScaleGradients(pl.Callback):
    """Multiply every gradient by ``factor`` after the backward of step ``step`` (inf: make them inf)."""

    def __init__(self, step: int, factor: float) -> None:
        self.step, self.factor = step, factor

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step == self.step:
            for p in pl_module.parameters():
                if p.grad is not None:
                    p.grad.mul_(self.factor)


def health_config(tmp: Path, steps: int, callbacks: list[dict], **trainer) -> dict:
    """A tiny ``mae pretrain`` config on the digits: ``steps`` steps, metrics every step."""
    return {
        "seed_everything": 0,
        "model": {
            "model": "mae_vit_tiny_patch4",
            "model_kwargs": {**TINY_KWARGS, "depth": 2},
            "optim": {"warmup_epochs": 0},
        },
        "data": {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 16, "batch_size": 8}},
        "trainer": {
            "max_steps": steps,
            "max_epochs": -1,
            "accelerator": "cpu",
            "devices": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "log_every_n_steps": 1,
            "limit_val_batches": 0,
            "logger": csv_logger(tmp, "health"),
            "callbacks": callbacks,
            **trainer,
        },
        "reconstruction": {"every_n_epochs": 0},
        "checkpoint": {"save_last": False, "save_top_k": 0},
    }


def scale_gradients(step: int, factor: float) -> dict:
    return {"class_path": f"{__name__}.ScaleGradients", "init_args": {"step": step, "factor": factor}}


def by_step(rows: list[dict], key: str) -> dict[int, float]:
    return {int(r["step"]): float(r[key]) for r in rows if r.get(key)}


def test_health__a_gradient_norm_jump_warns_once_naming_the_step_and_log_every_n_steps_is_kept(tmp_path):
    config = health_config(tmp_path, 14, [scale_gradients(12, 1e4)], log_every_n_steps=1)
    result = run_mae("pretrain", config=config, tmp=tmp_path, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout + result.stderr
    assert said.count("train/grad_norm jumped to") == 1, said[-3000:]
    assert "at step 12:" in said
    rows = read_metrics(tmp_path / "runs" / "health" / "version_0")
    norm = by_step(rows, "train/grad_norm")
    assert sorted(norm) == list(range(14)) and norm[12] > 100 * max(norm[s] for s in range(12))

    sparse = health_config(tmp_path, 6, [], log_every_n_steps=3)
    sparse["trainer"]["logger"] = csv_logger(tmp_path, "sparse")
    run_mae("pretrain", config=sparse, tmp=tmp_path)
    rows = read_metrics(tmp_path / "runs" / "sparse" / "version_0")
    for key in ("grad_norm", "update_ratio"):
        assert sorted(by_step(rows, f"train/{key}")) == [2, 5], key
