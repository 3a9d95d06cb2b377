"""Run guards: stop on a non-finite loss, checkpoint on SIGTERM, validate a resume checkpoint up front."""

from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from mae.convert.safe_load import safe_torch_load


def check_finite_loss(loss: torch.Tensor, module: pl.LightningModule) -> None:
    """Stop the run before a non-finite loss reaches the weights (or any checkpoint).

    Raises:
        FloatingPointError: naming the step, the epoch and the last checkpoint left intact.
    """
    if torch.isfinite(loss).item():
        return
    trainer = module.trainer
    callback = trainer.checkpoint_callback
    last = getattr(callback, "last_model_path", "") or "none written yet"
    raise FloatingPointError(
        f"non-finite training loss ({loss.item()}) at step {trainer.global_step} (epoch {trainer.current_epoch}); "
        f"stopped before the update, so no checkpoint holds it (last good: {last}). Resume from it with a lower lr, "
        f"bf16-mixed instead of 16-mixed, or check the input data."
    )


class SigtermCheckpoint(pl.Callback):
    """On SIGTERM (a scheduler's preemption notice) write a resumable ``last.ckpt`` before exiting.

    Lightning turns SIGTERM into an exception after the running step; other exceptions (a
    non-finite loss, a bug) do not save, so a broken state never overwrites a good checkpoint.
    """

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        callback = trainer.checkpoint_callback
        folder = Path(callback.dirpath) if callback is not None and callback.dirpath else Path(trainer.default_root_dir)
        path = folder / "last.ckpt"
        if callback is not None and hasattr(callback, "last_model_path"):
            # Recorded in the checkpoint: on resume, the checkpoint callback then keeps writing this
            # last.ckpt instead of starting a last-v1.ckpt beside it (as it would when the SIGTERM
            # comes before it has saved a last.ckpt of its own, i.e. in the first epoch).
            callback.last_model_path = str(path)
        trainer.save_checkpoint(path)
        rank_zero_info(f"SIGTERM: saved {path} at step {trainer.global_step}; resume with --ckpt_path {path}")


def check_resume_checkpoint(path: str | Path, module: pl.LightningModule) -> None:
    """Before any training: ``path`` exists, is a readable Lightning checkpoint, and fits ``module``.

    Raises:
        FileNotFoundError, ValueError: naming the file and what is wrong (missing, corrupt, other
            architecture: the differing keys and shapes).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--ckpt_path {path} does not exist (expected a .ckpt file written by this tool)")
    ckpt = safe_torch_load(path)
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "optimizer_states" not in ckpt:
        raise ValueError(
            f"--ckpt_path {path} is not a Lightning training checkpoint (no state_dict / optimizer_states); "
            f"to start from pretrained weights use model.checkpoint instead"
        )
    own = module.state_dict()
    saved = ckpt["state_dict"]
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    wrong = [f"{k}: {tuple(saved[k].shape)} in the file, {tuple(own[k].shape)} here"
             for k in sorted(set(own) & set(saved)) if saved[k].shape != own[k].shape]  # fmt: skip
    if missing or unexpected or wrong:
        details = []
        if wrong:
            details.append("shapes differ: " + "; ".join(wrong[:5]) + (" ..." if len(wrong) > 5 else ""))
        if missing:
            details.append(f"{len(missing)} tensors missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            details.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        raise ValueError(
            f"--ckpt_path {path} was written for another model architecture than this config builds: "
            + "; ".join(details)
        )
