"""What a finished run prints: where its outputs are (run folder, config, metrics, checkpoints, figures,
trackers), the loss per epoch, and its validation metrics in one line."""

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_only

from mae.training.callbacks import ReconstructionCallback
from mae.training.trackers import where_to_look

# (callback class, label): the figures a run's summary names, each by its callback's ``last_path``.
FIGURES: tuple[tuple[type, str], ...] = ((ReconstructionCallback, "reconstructions"),)


def run_summary(
    trainer: pl.Trainer, log_dir: Path, figures: tuple[tuple[type, str], ...] = FIGURES
) -> list[str]:
    """The lines that tell the user where the run's outputs are and how the loss went: the run folder
    ``log_dir``, its config and metrics, the last and best checkpoints, the newest figure of each of
    ``figures`` (callback class, label), the trackers, the loss per epoch and the resolution phases."""
    found = [("config", log_dir / "config.yaml"), ("metrics", log_dir / "metrics.csv")]
    rows = [(f"{name}:", str(path)) for name, path in found if path.exists()]
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None and checkpoint.last_model_path:
        rows.append(("last checkpoint:", checkpoint.last_model_path))
    if checkpoint is not None and checkpoint.best_model_path and checkpoint.monitor:
        rows.append(("best checkpoint:", f"{checkpoint.best_model_path} ({checkpoint.monitor})"))
    for cls, label in figures:
        paths = [cb.last_path for cb in trainer.callbacks if isinstance(cb, cls) and cb.last_path]
        rows += [(f"{label}:", str(paths[0]))] if paths else []
    rows += where_to_look(trainer)
    lines = [f"Run folder: {log_dir}", *(f"  {label:<18}{text}" for label, text in rows)]
    losses = getattr(trainer.lightning_module, "epoch_losses", [])
    if losses:
        lines.append("  train loss per epoch: " + " -> ".join(f"{v:.4f}" for v in losses))
    phases = getattr(trainer.lightning_module, "resolution_summary", None)  # model.resolution_schedule
    if phases:
        lines.append(f"  resolution phases run: {phases}")
    return lines


@rank_zero_only
def print_run_summary(
    trainer: pl.Trainer, log_dir: Path, figures: tuple[tuple[type, str], ...] = FIGURES
) -> None:
    """Print ``run_summary`` (``log_dir``: found on every process beforehand, since finding it is a
    collective)."""
    print("\n".join(run_summary(trainer, log_dir, figures)), flush=True)


@rank_zero_only
def print_accuracy(metrics: dict[str, float]) -> None:
    """``validation top-1 X%, top-5 Y%`` from ``val/acc1`` / ``val/acc5`` (fractions), when there."""
    if "val/acc1" in metrics:
        print(
            f"validation top-1 {metrics['val/acc1'] * 100:.2f}%, top-5 {metrics['val/acc5'] * 100:.2f}%",
            flush=True,
        )


@rank_zero_only
def print_metrics(metrics: dict[str, Any], prefix: str = "val/") -> None:
    """One line of the validation metrics whose names start with ``prefix`` (e.g. ``val/map 0.4312``)."""
    shown = [
        f"{name} {float(value):.4f}" for name, value in sorted(metrics.items()) if name.startswith(prefix)
    ]
    if shown:
        print("validation: " + ", ".join(shown), flush=True)
