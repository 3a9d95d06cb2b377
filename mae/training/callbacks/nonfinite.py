"""Non-finite capture: when a training loss or gradient first goes non-finite, the step is kept in the run
folder so that it can be replayed (``mae.training.replay``: what the folder holds, and the replay), and the
first module whose output is non-finite is named. Under fp16 (a ``GradScaler``), non-finite gradients are
the scaler's business (it skips the step and lowers the scale): only a non-finite loss is captured then.
"""

import contextlib
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from mae.compat.lightning import rng_states
from mae.errors import UserError
from mae.training.base import LossCapture
from mae.training.replay import CAPTURE_FOLDER, Finding, nonfinite_gradients, replay_step
from mae.training.sharding import full_training_state, is_sharded, total_norm


class NonFiniteError(UserError, FloatingPointError):
    """A training loss or gradient went non-finite: names the step, the first module whose output is
    non-finite, the capture folder and the command that replays it."""


class NonFiniteCapture(LossCapture, pl.Callback):
    """Keep a replayable step in ``<run>/nonfinite/step_<N>/`` when the training loss (checked by
    ``mae.training.base.check_finite_loss`` before the backward) or, without a ``GradScaler``, a gradient
    (checked after each backward, before the optimizer step) first goes non-finite; then stop the run with a
    ``NonFiniteError`` naming the first module whose output is non-finite, the folder and the command that
    replays it.

    Each step it keeps a reference to the batch and the random states (no copies); the gradient check
    costs one norm of the gradients per backward.

    Args:
        enabled: False: no capture; a non-finite loss still stops the run, a non-finite gradient does not.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._batch: Any = None
        self._batch_idx = 0
        self._rng: dict[str, Any] | None = None
        self._run_folder: Path | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Here on every process: finding the log folder is a collective, a capture happens on one.
        self._run_folder = Path(trainer.log_dir or trainer.default_root_dir)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.enabled:
            self._batch, self._batch_idx = batch, batch_idx
            self._rng = rng_states(include_cuda=trainer.strategy.root_device.type == "cuda")

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.enabled or getattr(trainer.precision_plugin, "scaler", None) is not None:
            return  # a GradScaler skips steps with non-finite gradients itself
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if not grads or torch.isfinite(total_norm(grads)).item():  # over every shard: all decide alike
            return
        raise self.capture(trainer, pl_module)

    def capture(
        self, trainer: pl.Trainer, module: pl.LightningModule, loss: torch.Tensor | None = None
    ) -> NonFiniteError:
        """Write the step's capture folder, replay the step's forward to find the first non-finite module,
        and return the error to stop the run with: of a non-finite ``loss``, or (None) of a non-finite
        gradient. Under several processes every process calls it at the same step; one whose own loss is
        finite writes nothing. Under FSDP2 no process holds the whole model to replay the step: the whole
        state is gathered (a collective) into the folder, and ``mae replay`` locates the module."""
        here = loss is None or not torch.isfinite(loss).item()  # this process's own step is non-finite
        full_state = None
        if is_sharded(trainer):
            with _built_size(module):
                full_state = full_training_state(module, trainer.optimizers)
            finding = Finding(located=False, loss=loss is not None)
        elif here:
            finding = replay_step(
                module, self._batch, self._batch_idx, self._rng, trainer.precision_plugin, backward=False
            )
            if loss is None and finding.module is None:
                finding = Finding(parameters=nonfinite_gradients(module))
        step, epoch = trainer.global_step, trainer.current_epoch
        if not here:
            return NonFiniteError(
                f"the training loss of another process is non-finite at step {step} (epoch {epoch}): stopped "
                "with it before the update (its error names the step's capture folder)"
            )
        folder = self._write(trainer, module, "gradient" if loss is None else "loss", finding, full_state)
        last = getattr(trainer.checkpoint_callback, "last_model_path", "") or "none written yet"
        what = "non-finite gradient" if loss is None else f"non-finite training loss ({loss.item()})"
        return NonFiniteError(
            f"{what} at step {step} (epoch {epoch}): {finding.describe()}; stopped before the update, so no "
            f"checkpoint holds it (last good: {last}). The step is kept in {folder}; replay it with: mae "
            f"replay {folder}. Resume from the last good checkpoint with a lower lr, bf16-mixed instead of "
            "16-mixed, or check the input data."
        )

    def _write(
        self,
        trainer: pl.Trainer,
        module: pl.LightningModule,
        reason: str,
        finding: Finding,
        full_state: tuple[dict, list[dict]] | None = None,
    ) -> Path:
        """The capture folder, written whole under a temporary name first; a folder of an earlier capture
        of the same step (a resumed run) is kept, this one gets the next free name. ``full_state``: the
        module's and optimizers' states gathered from the shards (FSDP2), else the module's own."""
        base = (self._run_folder or Path(trainer.default_root_dir)) / CAPTURE_FOLDER
        name = f"step_{trainer.global_step}"
        if trainer.world_size > 1:
            name += f"_rank{trainer.global_rank}"
        folder, n = base / name, 1
        while folder.exists() or folder.with_name(folder.name + ".partial").exists():
            n += 1
            folder = base / f"{name}_{n}"
        partial = folder.with_name(folder.name + ".partial")
        partial.mkdir(parents=True)
        torch.save(move_data_to_device(self._batch, "cpu"), partial / "batch.pt")
        torch.save(self._rng, partial / "rng.pt")
        with _built_size(module):
            state_dict = full_state[0] if full_state else module.state_dict()
        optimizer_states = full_state[1] if full_state else [o.state_dict() for o in trainer.optimizers]
        torch.save(
            {
                "state_dict": state_dict,
                "hyper_parameters": dict(module.hparams),
                "optimizer_states": optimizer_states,
                "global_step": trainer.global_step,
                "epoch": trainer.current_epoch,
                "pytorch-lightning_version": pl.__version__,
            },
            partial / "state.ckpt",
        )
        config = self._run_folder / "config.yaml" if self._run_folder is not None else None
        if config is not None and config.is_file():
            shutil.copy2(config, partial / "config.yaml")
        settings = getattr(module, "settings", None)
        record = {
            "module_class": f"{type(module).__module__}.{type(module).__qualname__}",
            "step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "batch_idx": self._batch_idx,
            "reason": reason,
            "precision": str(trainer.precision),
            "device": trainer.strategy.root_device.type,
            "attention": getattr(settings, "attention", None),
            # the input size (H, W) of the step: a phase of model.resolution_schedule
            "img_size": list(module.img_size) if hasattr(module, "at_img_size") else None,
            "found": finding.as_dict(),
            "torch": torch.__version__,
        }
        (partial / "step.json").write_text(json.dumps(record, indent=2) + "\n")
        partial.rename(folder)
        return folder


@contextmanager
def _built_size(module: pl.LightningModule) -> Iterator[None]:
    """Inside the block a pretraining module under progressive resolution holds the position embeddings
    of the size it was built at (what its checkpoints and ``load_from_checkpoint`` hold)."""
    with module.at_img_size() if hasattr(module, "at_img_size") else contextlib.nullcontext():
        yield
