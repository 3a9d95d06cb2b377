"""The LightningCLI machinery of ``mae pretrain``, ``finetune``, ``detect`` and ``segment`` (every model, data
and trainer key from YAML or flags): stacked configs, the linked model keys, trainer defaults and hardening,
``--ckpt_path`` resume, and what a finished run prints."""

import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from jsonargparse.typing import PositiveInt
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from mae.cli.commands import BY_NAME
from mae.cli.quiet import quiet_libraries, quiet_trainer
from mae.cli.recipes import RecipeNotFound, config_stack, read_config, resolve_config
from mae.data import ImageDataModule
from mae.dense.tasks.figures import PredictionFigures
from mae.errors import ConfigError, UserError
from mae.training.callbacks import (
    EMA,
    ImageThroughputMonitor,
    KNNCallback,
    NonFiniteCapture,
    ProbeCallback,
    ReconstructionCallback,
    RunHealth,
    harden_trainer,
)
from mae.training.callbacks.last_checkpoint import LastStateCheckpoint
from mae.training.callbacks.preemption import INTERRUPTED_EXIT_CODE, stop_exit_code
from mae.training.resume import planned_run_folder, prepare_resume, start_run_folder
from mae.training.runtime import default_lightning_precision, keep_freed_memory
from mae.training.settings import renamed_for, renamed_key_error
from mae.training.trackers import TRACKER_FILE, AttachTracker, check_tracker, tracker_spec, where_to_look


def trainer_defaults(run_name: str) -> dict[str, Any]:
    """Trainer settings when a config gives none: CSV metrics under ``runs/<run_name>``."""
    return {
        "precision": default_lightning_precision(),
        "logger": {
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": "runs", "name": run_name},
        },
        "log_every_n_steps": 10,
    }


class _MAECLI(LightningCLI):
    """Shared by the entry points: one input size (``data.img_size``) feeds the model; checkpoints
    and throughput logging are always on and configured under their own keys."""

    # model keys that come from the data module
    linked = {"img_size": "data.img_size", "in_chans": "data.in_chans"}
    command = "pretrain"  # its name in ``mae.cli.commands``: where ``--config NAME`` finds recipes

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        if isinstance(args, dict):
            super().parse_arguments(parser, args)
            return
        argv = [str(a) for a in (args if args is not None else sys.argv[1:])]
        try:
            argv = resolve_recipes(argv, BY_NAME[self.command].recipes)
        except RecipeNotFound as err:
            parser.error(str(err))
        argv = expand_stacked_configs(argv)  # reads and checks every config file: ConfigError naming it
        refuse_renamed_keys(argv, self.model_class)
        for key, source in self.linked.items():
            on_command_line = any(a == f"--model.{key}" or a.startswith(f"--model.{key}=") for a in argv)
            # jsonargparse drops a linked key set in a YAML file without a word: refuse it here.
            if on_command_line or key in _model_section_keys(argv):
                parser.error(
                    f"model.{key} is taken from {source} so data and model agree: set {source} instead"
                )
        self.config = parser.parse_args(argv)  # as LightningCLI does, with the stacked configs' bases added

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.img_size", "model.img_size", apply_on="instantiate")
        parser.link_arguments("data.in_chans", "model.in_chans", apply_on="instantiate")
        parser.add_lightning_class_args(LastStateCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.filename": "epoch_{epoch:04d}",
                "checkpoint.auto_insert_metric_name": False,
                "checkpoint.save_last": True,
                "checkpoint.save_top_k": -1,
                "checkpoint.every_n_epochs": 10,
            }
        )
        parser.add_lightning_class_args(ImageThroughputMonitor, "throughput")
        parser.add_lightning_class_args(RunHealth, "health")  # grad norm, update ratio, loss scale
        parser.add_lightning_class_args(NonFiniteCapture, "nonfinite")  # a replayable non-finite step
        parser.add_subclass_arguments(
            Logger,
            "tracker",
            instantiate=False,
            required=False,
            help="An experiment tracker beside the CSV metrics, continued on resume (mae.training.trackers): "
            "a Lightning logger and its own settings; recipes: --config loggers/tensorboard | "
            "loggers/mlflow | loggers/wandb",
        )
        parser.add_argument(
            "--ckpt_path",
            type=str | None,
            default=None,
            help="Resume from this checkpoint, e.g. <run>/checkpoints/last.ckpt, continuing in its run "
            "folder; 'last': the newest last.ckpt of the configured run, or a fresh start when there is "
            "none (requeue-safe)",
        )


class PretrainCLI(_MAECLI):
    """``mae pretrain``: adds reconstruction figures and the kNN monitor."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_lightning_class_args(ReconstructionCallback, "reconstruction")
        parser.add_lightning_class_args(KNNCallback, "knn")
        parser.set_defaults({"knn.every_n_epochs": 0})
        parser.add_lightning_class_args(ProbeCallback, "probe")
        add_batch_size_search(parser)


def add_batch_size_search(parser: LightningArgumentParser) -> None:
    """``--find_batch_size`` (``mae.cli.batch_size``): only search the largest batch that fits."""
    parser.add_argument(
        "--find_batch_size",
        type=bool,
        default=False,
        help="Only find the largest data.batch_size per device that fits (from the configured one, "
        "doubling) and print it with its lr by the paper's rule; trains a few steps per try, writes nothing",
    )
    parser.add_argument(
        "--find_batch_size_max_trials",
        type=PositiveInt,
        default=25,
        help="At most this many batch sizes tried by --find_batch_size (on CPU, where nothing runs out of "
        "memory, the search stops only here or at the training split's size)",
    )


class FinetuneCLI(_MAECLI):
    """``mae finetune``: the class count comes from the data too; the best checkpoint by ``val/acc1``."""

    linked = {
        "img_size": "data.img_size",
        "in_chans": "data.in_chans",
        "num_classes": "data (its number of classes)",
    }
    command = "finetune"

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.link_arguments("data.num_labels", "model.num_classes", apply_on="instantiate")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val/acc1",
                "checkpoint.mode": "max",
                "checkpoint.save_top_k": 1,
                "checkpoint.every_n_epochs": 1,
            }
        )
        parser.add_argument(
            "--validate_only",
            type=bool,
            default=False,
            help="Only evaluate (top-1/top-5 on the validation split), e.g. a fine-tuned --ckpt_path",
        )
        parser.add_lightning_class_args(EMA, "ema")  # weight EMA: --ema.decay 0.9999 (off by default)


class DenseCLI(_MAECLI):
    """``mae detect``: the class count comes from the data; the best checkpoint by ``val/map``;
    prediction figures under ``figures``."""

    linked = {
        "img_size": "data.img_size",
        "in_chans": "data.in_chans",
        "num_classes": "data (its number of classes)",
    }
    best = "val/map"
    command = "detect"

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.set_defaults(
            {
                "checkpoint.monitor": self.best,
                "checkpoint.mode": "max",
                "checkpoint.save_top_k": 1,
                "checkpoint.every_n_epochs": 1,
            }
        )
        parser.add_lightning_class_args(PredictionFigures, "figures")
        parser.add_argument(
            "--validate_only",
            type=bool,
            default=False,
            help=f"Only evaluate ({self.best} on the validation split), e.g. a trained --ckpt_path",
        )


class SegmentCLI(DenseCLI):
    """``mae segment``: as ``mae detect``, with the ignored label from the data too; the best checkpoint by
    ``val/miou``."""

    linked = {**DenseCLI.linked, "ignore_index": "data.ignore_index"}
    best = "val/miou"
    command = "segment"

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.link_arguments("data.ignore_index", "model.ignore_index", apply_on="instantiate")


def _config_files(argv: list[str]) -> list[tuple[int, str]]:
    """(position, path) of every ``--config PATH`` / ``--config=PATH`` (or ``-c``) in ``argv``."""
    found = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            found.append((i + 1, argv[i + 1]))
        elif arg.startswith(("--config=", "-c=")):
            found.append((i, arg.split("=", 1)[1]))
    return found


def resolve_recipes(argv: list[str], folders: tuple[str, ...]) -> list[str]:
    """``argv`` with every ``--config NAME`` that names a recipe rather than a file replaced by the
    recipe's path (``mae.cli.recipes.resolve_config``)."""
    out = list(argv)
    for position, value in _config_files(argv):
        path = resolve_config(value, folders)
        out[position] = f"{out[position].split('=', 1)[0]}={path}" if out[position] != value else path
    return out


def expand_stacked_configs(argv: list[str]) -> list[str]:
    """Put the bases of every stacked config given without them before it.

    A stacked config names its base on its first line (``# stacks on: base.yaml``, relative to the
    file; the base may stack on another: ``mae.cli.recipes.config_stack``); ``--config base.yaml --config
    stacked.yaml`` is the documented form, and a stacked config given alone gets its bases inserted before
    it, once, so it still runs the whole recipe. Every config file is read and checked on the way.

    Raises:
        ConfigError: a config file, or a base it stacks on, cannot be used (``mae.cli.recipes.read_config``).
    """
    out = list(argv)
    given = {Path(path).resolve() for _, path in _config_files(argv)}
    inserted = 0
    for position, path in _config_files(argv):
        bases = [base for base in config_stack(path)[:-1] if base.resolve() not in given]
        given |= {base.resolve() for base in bases}
        start = position + inserted - (0 if argv[position].startswith(("--config=", "-c=")) else 1)
        out[start:start] = [arg for base in bases for arg in ("--config", str(base))]
        inserted += 2 * len(bases)
    return out


def _model_section_keys(argv: list[str]) -> set[str]:
    """Keys under ``model:`` in the YAML files given with ``--config``."""
    keys: set[str] = set()
    for _, path in _config_files(argv):
        config = read_config(path)
        if isinstance(config.get("model"), dict):
            keys |= set(config["model"])
    return keys


def refuse_renamed_keys(argv: list[str], module_class: type) -> None:
    """Stop before any work when ``argv`` sets a key renamed in 0.3.0 (``--model.base_lr``, or ``base_lr``
    under ``model:`` in a ``--config`` file) that ``module_class`` now takes under its new name.

    Raises:
        ConfigError: naming the old key and the new one (``mae.training.settings.RENAMED_KEYS``).
    """
    given = _model_section_keys(argv) | {
        a.split("=", 1)[0].removeprefix("--model.") for a in argv if a.startswith("--model.")
    }
    for old in renamed_for(module_class):
        if old.removeprefix("model.") in given:
            raise renamed_key_error(old)


# Where Lightning's own code lives: an error raised there, called by LightningCLI or jsonargparse building a
# class of the config, is Lightning refusing a setting (``lightning_refusal``).
LIGHTNING_PACKAGES = ("lightning", "lightning_fabric", "pytorch_lightning")


def _frames(err: BaseException) -> list[Any]:
    """The frames of ``err``'s traceback, outermost first."""
    frames, tb = [], err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _package(frame: Any) -> str:
    return frame.f_globals.get("__name__", "").split(".")[0]


def lightning_refusal(err: BaseException) -> ConfigError | None:
    """``err`` as the ``ConfigError`` of the setting it refuses, when it is Lightning refusing a setting of
    the trainer, a callback or a logger (a ``MisconfigurationException`` or ``ValueError`` raised in
    Lightning's own code while LightningCLI builds the Trainer, or jsonargparse a callback or logger, e.g.
    ``trainer.max_epochs: -5``): names the key (``trainer.max_epochs``) and Lightning's reason. Else None:
    an error raised in or through the project's code (our modules, callbacks, data) is a bug and keeps its
    traceback, and the project's own errors are left as they are."""
    refusal: BaseException | None = err
    while refusal is not None and (frames := _frames(refusal)) and _package(frames[-1]) == "jsonargparse":
        refusal = refusal.__cause__ or refusal.__context__  # jsonargparse's wrapping of a class's error
    if not isinstance(refusal, (MisconfigurationException, ValueError)) or isinstance(refusal, UserError):
        return None
    frames = _frames(refusal)
    builders = [
        i
        for i, frame in enumerate(frames)
        if _package(frame) == "jsonargparse"
        or (_package(frame) in LIGHTNING_PACKAGES and frame.f_code.co_name == "_instantiate_trainer")
    ]
    if not builders or builders[-1] == len(frames) - 1:
        return None
    inside = frames[builders[-1] + 1 :]  # the class being built, down to the raise
    built = inside[0].f_locals.get("self")
    if built is None or any(_package(frame) not in LIGHTNING_PACKAGES for frame in inside):
        return None
    cls = type(built)
    section, listed = ("trainer", False) if isinstance(built, pl.Trainer) else _section(_frames(err))
    reason = str(refusal).strip()
    parameters = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    named = sorted(
        (match.start(), p) for p in parameters if (match := re.search(rf"\b{re.escape(p)}\b", reason))
    )
    key = section or cls.__name__
    if named:
        key = f"{key} ({cls.__name__}.{named[0][1]})" if listed else f"{key}.{named[0][1]}"
    return ConfigError(f"{key}: {reason} (refused by Lightning's {cls.__name__})")


def _section(frames: list[Any]) -> tuple[str | None, bool]:
    """The config section jsonargparse was building a class of, in the frames of its traceback (a group such
    as ``checkpoint``, or a typed key such as ``trainer.callbacks``, then True), or (None, False)."""
    for frame in reversed(frames):
        if _package(frame) != "jsonargparse":
            continue
        if frame.f_code.co_name == "group_instantiate_class" and isinstance(frame.f_locals.get("key"), str):
            return frame.f_locals["key"], False
        dest = getattr(frame.f_locals.get("self"), "dest", None)
        if frame.f_code.co_name == "instantiate_classes" and isinstance(dest, str):
            return dest, True
    return None, False


def _cli_arguments(cli_class: type[_MAECLI], run_name: str) -> dict[str, Any]:
    """What every command passes to its LightningCLI besides the model and data classes."""
    return {
        "subclass_mode_data": True,
        "run": False,
        "seed_everything_default": 0,
        "trainer_defaults": trainer_defaults(run_name),
        "save_config_kwargs": {"overwrite": True},
        "parser_kwargs": {"prog": f"mae {cli_class.command}"},
    }


def check_torchrun_processes(trainer: pl.Trainer) -> None:
    """Refuse a run that ``torchrun`` started as more or fewer processes than ``trainer.num_nodes`` x
    ``trainer.devices``: with one device on one node Lightning would train each process alone, all of them
    writing the same run folder; with more it would fail at launch.

    Raises:
        ConfigError: torchrun's ``WORLD_SIZE`` (``--nnodes`` x ``--nproc-per-node``) is not
            ``trainer.num_nodes`` x ``trainer.devices``.
    """
    if not TorchElasticEnvironment.detect():
        return
    world, per_node = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if world != trainer.num_nodes * trainer.num_devices:
        raise ConfigError(
            f"torchrun started {world} processes ({world // per_node} node(s) x {per_node}) but "
            f"trainer.num_nodes x trainer.devices is {trainer.num_nodes} x {trainer.num_devices}: set "
            f"--trainer.num_nodes {world // per_node} --trainer.devices {per_node}"
        )


def build(
    cli_class: type[_MAECLI],
    module: type,
    run_name: str,
    args: list[str] | None,
    datamodule_class: type[pl.LightningDataModule] = ImageDataModule,
) -> tuple[Any, str | None]:
    """Parse and instantiate (trainer defaults: ``trainer_defaults(run_name)``); then check
    ``--ckpt_path`` and harden the trainer, all before any work. Returns (cli, resolved ckpt_path)."""
    keep_freed_memory()  # no page faults re-mapping activations every step (mae.training.runtime)
    quiet_libraries()
    try:
        cli = cli_class(module, datamodule_class, args=args, **_cli_arguments(cli_class, run_name))
    except (MisconfigurationException, ValueError) as err:
        refusal = lightning_refusal(err)  # a trainer, callback or logger setting Lightning refuses
        if refusal is None:
            raise
        raise refusal from err
    check_torchrun_processes(cli.trainer)
    harden_trainer(cli.trainer)
    quiet_trainer(cli.trainer)
    fitting = not cli.config.get("validate_only", False)
    try:
        tracker = tracker_spec(cli.config.get("tracker"))
    except ValueError as err:
        cli.parser.error(str(err))
    ckpt_path, resume_step = prepare_resume(cli.trainer, cli.model, cli.config.ckpt_path, fitting)
    if tracker is not None:
        tracker_step = resume_step if fitting else None
        # Its folders, store, credentials and the run folder's tracker.json, before the run folder is made;
        # on the process that talks to it (a refusal there comes before the others are started).
        if cli.trainer.is_global_zero:
            check_tracker(tracker, planned_run_folder(cli.trainer), tracker_step)
        cli.trainer.callbacks.append(AttachTracker(tracker, cli.config.as_dict(), tracker_step))
    return cli, ckpt_path


class _ParserBuilt(Exception):
    def __init__(self, parser: LightningArgumentParser):
        super().__init__()
        self.parser = parser


def cli_parser(
    cli_class: type[_MAECLI],
    module: type,
    run_name: str,
    datamodule_class: type[pl.LightningDataModule] = ImageDataModule,
) -> LightningArgumentParser:
    """The parser ``build`` parses the command line with, built without parsing anything (for shell
    completion and the option checks)."""

    class ParserOnly(cli_class):
        def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
            raise _ParserBuilt(parser)

    try:
        ParserOnly(module, datamodule_class, args=[], **_cli_arguments(cli_class, run_name))
    except _ParserBuilt as built:
        return built.parser
    raise RuntimeError(f"{cli_class.__name__} parsed its arguments without calling parse_arguments")


# What a run writes into its run folder before its first step (LightningCLI's config, the logger's files).
BEFORE_FIRST_STEP = ("config.yaml", "hparams.yaml", "metrics.csv", TRACKER_FILE)


def run(cli: LightningCLI, stage: str, ckpt_path: str | None) -> Any:
    """``trainer.fit`` or ``trainer.validate`` in a run folder of its own (``start_run_folder``: claimed
    before anything is written, so runs started at the same moment never share one).

    After a SIGTERM or a first Ctrl-C (and, when fitting, its checkpoint) exit with
    ``PREEMPTED_EXIT_CODE`` or ``INTERRUPTED_EXIT_CODE``, not 0; a second Ctrl-C, or one during
    start-up, exits with ``INTERRUPTED_EXIT_CODE`` at once. A run that fails or is stopped before its
    first step (e.g. 0 steps), and an evaluation that fails, remove the run folder they created
    (``_remove_unused_run_folder``), so the next run does not become ``version_1``."""
    trainer, created = cli.trainer, None  # created: (run folder, folders above it made for it)

    def remove_unused() -> None:
        if created is not None and (stage != "fit" or trainer.global_step == 0):
            _remove_unused_run_folder(*created)

    try:
        created = start_run_folder(trainer)
        return getattr(trainer, stage)(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path)
    except SIGTERMException:
        remove_unused()
        sys.exit(stop_exit_code(trainer))
    except (KeyboardInterrupt, SystemExit) as stop:
        # Lightning ends a KeyboardInterrupt itself (teardown, then exit status 1)
        if isinstance(stop, SystemExit) and not isinstance(stop.__context__, KeyboardInterrupt):
            raise
        remove_unused()
        rank_zero_info(
            f"Ctrl-C: stopped at step {trainer.global_step} without saving a checkpoint; exiting with "
            f"status {INTERRUPTED_EXIT_CODE}"
        )
        sys.exit(INTERRUPTED_EXIT_CODE)
    except Exception:
        remove_unused()
        raise


def _remove_unused_run_folder(folder: Path, new_parents: list[Path]) -> None:
    """Remove ``folder`` if it holds only what a run writes before its first step, then those of
    ``new_parents`` (created by this run, deepest first) left empty; nothing else is touched."""
    if folder.is_dir() and all(p.is_file() and p.name in BEFORE_FIRST_STEP for p in folder.iterdir()):
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
        for parent in new_parents:
            if not parent.is_dir() or any(parent.iterdir()):
                break
            parent.rmdir()


def fit(cli: LightningCLI, ckpt_path: str | None) -> None:
    """``run`` the fit, then print where the run's outputs are."""
    run(cli, "fit", ckpt_path)
    print_run_summary(cli.trainer, Path(cli.trainer.log_dir or cli.trainer.default_root_dir))


@rank_zero_only
def print_accuracy(metrics: dict[str, float]) -> None:
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


@rank_zero_only
def print_run_summary(trainer: pl.Trainer, log_dir: Path) -> None:
    """Tell the user where the run's outputs are and how the loss went (``log_dir``: found on every
    process beforehand, since finding it is a collective)."""
    lines = [f"Run folder: {log_dir}"]
    for name, path in (("config", log_dir / "config.yaml"), ("metrics", log_dir / "metrics.csv")):
        if path.exists():
            lines.append(f"  {name + ':':<18}{path}")
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None and checkpoint.last_model_path:
        lines.append(f"  {'last checkpoint:':<18}{checkpoint.last_model_path}")
    if checkpoint is not None and checkpoint.best_model_path and checkpoint.monitor:
        lines.append(f"  {'best checkpoint:':<18}{checkpoint.best_model_path} ({checkpoint.monitor})")
    figures = [
        cb.last_path for cb in trainer.callbacks if isinstance(cb, ReconstructionCallback) and cb.last_path
    ]
    if figures:
        lines.append(f"  {'reconstructions:':<18}{figures[0]}")
    predictions = [
        cb.last_path for cb in trainer.callbacks if isinstance(cb, PredictionFigures) and cb.last_path
    ]
    if predictions:
        lines.append(f"  {'predictions:':<18}{predictions[0]}")
    lines += [f"  {label:<18}{text}" for label, text in where_to_look(trainer)]
    losses = getattr(trainer.lightning_module, "epoch_losses", [])
    if losses:
        shown = " -> ".join(f"{v:.4f}" for v in losses)
        lines.append(f"  train loss per epoch: {shown}")
    phases = getattr(trainer.lightning_module, "resolution_summary", None)  # model.resolution_schedule
    if phases:
        lines.append(f"  resolution phases run: {phases}")
    print("\n".join(lines), flush=True)
