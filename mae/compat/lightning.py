"""Private names of Lightning (tested with lightning 2.6.6).

- ``lightning.pytorch.trainer.connectors.signal_connector._SignalConnector``, its SIGTERM handler
  ``_sigterm_notifier_fn``, its ``_register_signal`` and the trainer's ``_signal_connector``: Lightning's
  SIGTERM handler runs a collective inside the handler, and no public setting replaces it; a handler set
  as Lightning sets its own is restored by the connector's ``teardown`` (Ctrl-C's, ``set_handler``).
- ``_version`` of a logger that keeps each run in a version folder (``CSVLogger``,
  ``TensorBoardLogger``): the public ``version`` chooses a new version when read, and none is set
  after construction.
- ``lightning.pytorch.utilities.model_summary.model_summary._format_summary_table``: the text of the
  model summary, which ``ModelSummary.summarize`` only logs.
- ``RichProgressBar._get_train_description``: the progress bar's "Epoch N/M" text; no public hook.
- ``lightning.fabric.utilities.logger._convert_params`` and ``_flatten_dict``: how every Lightning
  logger turns nested settings into flat ``a/b`` keys; the trackers compare what an MLflow run already
  holds, and write TensorBoard's HPARAMS tab, under the same keys.
- ``TensorBoardLogger._sanitize_params``: the values TensorBoard's hyperparameters accept, as that
  logger converts them.
- ``"_instantiator"``, the hyperparameter that names the function Lightning's ``load_from_checkpoint``
  rebuilds a module with (``instantiator(module_class, hparams)``; LightningCLI records its own there):
  the one way to rebuild from hyperparameters that need translating (``INSTANTIATOR_KEY``), and
  ``lightning.pytorch.core.saving._ALLOWED_INSTANTIATORS``, the instantiators it trusts
  (``allow_instantiator``; Lightning's own message says to add one there; ``instantiator_allowed``: a
  capture's record checked before Lightning reads it).
- ``ModelCheckpoint._every_n_epochs``, ``_should_save_on_train_epoch_end``,
  ``_should_skip_saving_checkpoint``, ``_monitor_candidates`` and ``_save_last_checkpoint``: Lightning
  2.6 rewrites ``last.ckpt`` only at a step where a top-k checkpoint was saved (a monitored metric that
  improved), and no setting makes ``last.ckpt`` the run's latest state; ``refresh_last_checkpoint``
  writes it as Lightning's own ``save_last`` does.
- ``lightning.fabric.utilities.seed._collect_rng_states`` / ``_set_rng_states``: every random state a step
  draws from (torch CPU and CUDA, numpy, Python), as Lightning's own checkpoints save them
  (``rng_states``, ``restore_rng_states``); a captured non-finite step is replayed from them.
- ``trainer._logger_connector.should_update_logs``: whether this step's metrics are written
  (``log_every_n_steps``); the run-health metrics are computed on those steps only (``is_logging_step``).
- ``Trainer._default_root_dir``: the folder Lightning's tuner writes its temporary checkpoint into, set
  to a scratch folder by ``mae pretrain --find_batch_size`` (``set_scratch_root``); no setting after
  construction.
- ``ModelParallelStrategy._data_parallel_size`` and ``_tensor_parallel_size``: the device mesh's sizes,
  which its constructor takes as numbers or "auto" (data parallel over the nodes, tensor parallel within
  one); FSDP2 over every process needs the world size, known only when the processes are
  (``set_data_parallel_only``).
- ``LightningCLI._instantiate_trainer``: the method that builds the Trainer from the parsed config; an
  error raised below its frame is Lightning refusing a trainer setting (``builds_trainer``), as an error
  below jsonargparse's is Lightning refusing a callback's or logger's. No public hook wraps it.
- ``MLFlowLogger._initialized`` and ``WandbLogger._experiment``: whether the logger has started its
  run; the public ``experiment`` (and what reads it: ``run_id``) starts one when asked.
"""

import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table

INSTANTIATOR_KEY = "_instantiator"
# Where Lightning's own code lives (a frame's top-level package).
LIGHTNING_PACKAGES = ("lightning", "lightning_fabric", "pytorch_lightning")


def allow_instantiator(path: str) -> None:
    """Let ``load_from_checkpoint`` rebuild modules with the function at ``path`` (module.name), named in
    the hyperparameters under ``INSTANTIATOR_KEY``."""
    from lightning.pytorch.core.saving import _ALLOWED_INSTANTIATORS

    _ALLOWED_INSTANTIATORS.add(path)


def instantiator_allowed(path: object) -> bool:
    """Whether ``load_from_checkpoint`` rebuilds a module with the instantiator ``path`` (a checkpoint's
    ``INSTANTIATOR_KEY``): one of Lightning's trusted paths, or one ``allow_instantiator`` added."""
    from lightning.pytorch.core.saving import _ALLOWED_INSTANTIATORS

    return isinstance(path, str) and path in _ALLOWED_INSTANTIATORS


class SignalConnector(_SignalConnector):
    """Lightning's signal handling (SLURM's requeue signal included), with its SIGTERM handler as the
    overridable ``on_sigterm``; ``install_signal_connector`` puts one on a trainer."""

    def on_sigterm(self, signum: int) -> None:
        """Lightning's SIGTERM handler: record the signal, forward it to the launched processes and
        broadcast it to the other ranks."""
        super()._sigterm_notifier_fn(signum, None)

    def _sigterm_notifier_fn(self, signum: int, frame: FrameType | None) -> None:
        self.on_sigterm(signum)

    def set_handler(
        self, signum: int, handler: Callable[[int, FrameType | None], Any] | signal.Handlers
    ) -> None:
        """Handle ``signum`` with ``handler`` (a function or ``signal.SIG_*``), set as Lightning sets its
        handlers (from the main thread only); ``teardown`` restores the handler that
        ``register_signal_handlers`` found."""
        self._register_signal(signum, handler)


def signal_connector(trainer: pl.Trainer) -> _SignalConnector:
    """The trainer's signal connector (a ``SignalConnector`` once installed)."""
    return trainer._signal_connector


def install_signal_connector(trainer: pl.Trainer, connector: SignalConnector) -> None:
    """Make ``connector`` the trainer's signal handling from its next ``fit`` / ``validate`` on."""
    trainer._signal_connector = connector


def keeps_versions(logger: Any) -> bool:
    """Whether ``logger`` keeps each run in a folder of its own (``root_dir/<version>``)."""
    return logger is not None and hasattr(logger, "root_dir") and hasattr(logger, "_version")


def version_chosen(logger: Any) -> bool:
    """Whether a versioned logger's version is fixed (given, or chosen on first use)."""
    return logger._version is not None


def set_version(logger: Any, version: int | str) -> None:
    """Make a versioned logger write into ``version`` (``version_N`` for an int) before its first use."""
    logger._version = version


def format_summary_table(
    total_parameters: int,
    trainable_parameters: int,
    model_size: float,
    total_training_modes: dict[str, int],
    total_flops: int,
    *columns: tuple[str, list[str]],
) -> str:
    """The text ``ModelSummary.summarize`` logs, of the given columns (header, values)."""
    return _format_summary_table(
        total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *columns
    )


class DescribedRichProgressBar(RichProgressBar):
    """Lightning's rich progress bar with the training bar's description as the overridable
    ``train_description``."""

    def train_description(self, current_epoch: int) -> str:
        """Lightning's description: "Epoch N/M"."""
        return super()._get_train_description(current_epoch)

    def _get_train_description(self, current_epoch: int) -> str:
        return self.train_description(current_epoch)


def flatten_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` (nested dicts) as Lightning's loggers log them: one level, keys joined by ``/``."""
    from lightning.fabric.utilities.logger import _convert_params, _flatten_dict

    return _flatten_dict(_convert_params(params))


def tensorboard_param_values(flat: dict[str, Any]) -> dict[str, Any]:
    """``flat`` (``flatten_params``) with each value as ``TensorBoardLogger`` logs it: numbers, strings,
    booleans and tensors as they are, anything else as its text."""
    from lightning.pytorch.loggers import TensorBoardLogger

    return TensorBoardLogger._sanitize_params(flat)


def mlflow_run_started(logger: Any) -> bool:
    """Whether an ``MLFlowLogger`` has found or created its run (reading ``logger.run_id`` would create
    it)."""
    return bool(logger._initialized)


def wandb_run_started(logger: Any) -> bool:
    """Whether a ``WandbLogger`` has started its run (reading ``logger.experiment`` would start it)."""
    return logger._experiment is not None


def checkpoint_period_epochs(callback: ModelCheckpoint) -> int:
    """``callback``'s ``every_n_epochs`` (0: it saves by steps or time instead)."""
    return callback._every_n_epochs


def checkpoints_at_train_epoch_end(callback: ModelCheckpoint, trainer: pl.Trainer) -> bool:
    """Whether ``callback`` saves at the end of the training epoch (no validation this epoch, or as set)
    rather than at the end of validation."""
    return callback._should_save_on_train_epoch_end(trainer)


def refresh_last_checkpoint(callback: ModelCheckpoint, trainer: pl.Trainer) -> None:
    """Write ``callback``'s ``last.ckpt`` now, as its ``save_last`` does, unless it is off or Lightning would
    not save at this moment (sanity check, not fitting, ``fast_dev_run``, a checkpoint already written at
    this step)."""
    if callback.save_last and not callback._should_skip_saving_checkpoint(trainer):
        callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))


def rng_states(include_cuda: bool) -> dict[str, Any]:
    """Every random state a training step draws from: torch CPU, CUDA when ``include_cuda``, numpy, Python."""
    return _collect_rng_states(include_cuda=include_cuda)


def restore_rng_states(states: dict[str, Any]) -> None:
    """Set the random states ``rng_states`` returned."""
    _set_rng_states(states)


def is_logging_step(trainer: pl.Trainer) -> bool:
    """Whether the metrics of the running training step are written (``log_every_n_steps``)."""
    return trainer._logger_connector.should_update_logs


def set_scratch_root(trainer: pl.Trainer, folder: str) -> None:
    """Make ``folder`` the trainer's ``default_root_dir`` (where Lightning's tuner writes its temporary
    checkpoint)."""
    trainer._default_root_dir = folder


def set_data_parallel_only(strategy: Any, world_size: int) -> None:
    """Make a ``ModelParallelStrategy``'s device mesh one data-parallel dimension of ``world_size``
    processes (no tensor parallelism); call before its ``setup_environment`` builds the mesh."""
    strategy._data_parallel_size = world_size
    strategy._tensor_parallel_size = 1


def builds_trainer(frame: FrameType) -> bool:
    """Whether ``frame`` is LightningCLI's building of the Trainer from the parsed config."""
    package = frame.f_globals.get("__name__", "").split(".")[0]
    return package in LIGHTNING_PACKAGES and frame.f_code.co_name == "_instantiate_trainer"
