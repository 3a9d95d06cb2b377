"""What a training command prints, without the noise users did not ask for: Lightning's advertisements
for its cloud services, a deprecation warning between Lightning and torch that no user can act on, a
model summary's FLOPs of 0 (Lightning counts them only for a module with an example input), and a
progress bar that reads "Epoch 0/-2" for a run bounded by steps (``max_epochs -1``)."""

import logging
import warnings
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelSummary, RichModelSummary, RichProgressBar
from lightning.pytorch.callbacks.model_summary import log  # Lightning's logger: its handler prints

from mae.compat.lightning import DescribedRichProgressBar, format_summary_table

# Lightning's rank-zero messages that advertise its services ("💡 Tip: ... litlogger / litmodels").
ADVERTISEMENT = "💡 Tip:"


class _DropAdvertisements(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(ADVERTISEMENT)


def quiet_libraries() -> None:
    """Drop Lightning's advertisements and the ``LeafSpec`` deprecation warning its pytree helper raises
    under torch 2.10+ (Lightning's code, nothing a user can change), and FSDP2's warning, every step, that
    the sharded network returned a view (a warning about in-place ops on the outputs, which the training
    steps never do)."""
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropAdvertisements) for f in rank_zero.filters):
        rank_zero.addFilter(_DropAdvertisements())
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(\w+\) returned a view tensor")


class ModelSummaryWithoutUncountedFlops(ModelSummary):
    """Lightning's model summary, as text, without the FLOPs column and total when nothing was counted."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        if total_flops == 0:
            summary_data = [(header, values) for header, values in summary_data if header != "FLOPs"]
        table = format_summary_table(
            total_parameters,
            trainable_parameters,
            model_size,
            total_training_modes,
            total_flops,
            *summary_data,
        )
        if total_flops == 0:
            table = "\n".join(
                line for line in table.splitlines() if not line.rstrip().endswith("Total Flops")
            )
        log.info("\n" + table)


class StepBoundedProgressBar(DescribedRichProgressBar):
    """Lightning's rich progress bar; "Epoch N" alone when the run has no last epoch (``max_epochs -1``)."""

    def train_description(self, current_epoch: int) -> str:
        if self.trainer.max_epochs is None or self.trainer.max_epochs < 0:
            return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"
        return super().train_description(current_epoch)


def quiet_trainer(trainer: pl.Trainer) -> None:
    """Swap the trainer's default model summary and rich progress bar for the quiet ones above."""
    for callback in trainer.callbacks:
        if type(callback) in (ModelSummary, RichModelSummary):
            callback.__class__ = ModelSummaryWithoutUncountedFlops  # the same summary, its settings kept
        elif type(callback) is RichProgressBar:
            callback.__class__ = StepBoundedProgressBar  # the same bar, its settings kept; one method differs
