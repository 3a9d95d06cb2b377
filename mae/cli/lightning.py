"""The LightningCLI machinery of ``mae pretrain``, ``distill``, ``finetune``, ``detect`` and ``segment``
(every model, data and trainer key from YAML or flags): stacked configs, the linked model keys, trainer
defaults and hardening, ``--ckpt_path`` resume, and what a finished run prints."""

import sys
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import yaml
from jsonargparse.typing import PositiveInt
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from mae.cli.commands import BY_NAME
from mae.cli.moved_classes import refuse_moved_class_paths
from mae.cli.quiet import quiet_libraries, quiet_trainer
from mae.cli.recipes import RecipeNotFound, resolve_config
from mae.data import ImageDataModule
from mae.dense.tasks.figures import PredictionFigures
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
from mae.training.config_files import config_stack, read_config
from mae.training.lightning_refusal import lightning_refusal
from mae.training.resume import prepare_resume
from mae.training.run_summary import FIGURES, print_run_summary
from mae.training.runtime import default_lightning_precision, keep_freed_memory
from mae.training.settings import renamed_for, renamed_key_error
from mae.training.stage import run_stage
from mae.training.torchrun import check_torchrun_processes
from mae.training.trackers import attach_tracker, tracker_spec


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
        refuse_moved_class_paths(class_path_sources(argv))
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


class DistillCLI(_MAECLI):
    """``mae distill``: the machinery of ``mae pretrain`` (checkpoints, resume, trackers, the non-finite
    capture), its recipes in ``mae/configs/distill/``."""

    command = "distill"


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
    file; the base may stack on another: ``mae.training.config_files.config_stack``); ``--config base.yaml
    --config stacked.yaml`` is the documented form, and a stacked config given alone gets its bases
    inserted before it, once, so it still runs the whole recipe. Every config file is read and checked on
    the way.

    Raises:
        ConfigError: a config file, or a base it stacks on, cannot be used
            (``mae.training.config_files.read_config``).
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


def class_path_sources(argv: list[str]) -> list[tuple[str, Any]]:
    """What in ``argv`` may name classes, as (how the user gave it, its content): every ``--config`` file
    read (``read_config``), and every other option's value: a YAML file's content (``--data data.yaml``, a
    list of ``--trainer.callbacks``), a mapping or list written inline (``--data '{class_path: ...}'``), or
    the string itself (``--data CLASS``, ``--data.class_path CLASS``)."""
    files = _config_files(argv)
    sources: list[tuple[str, Any]] = [(f"--config {path}", read_config(path)) for _, path in files]
    configs = {position for position, _ in files}
    for i, arg in enumerate(argv):
        if i in configs or not arg.startswith("--") or arg == "--config":
            continue
        name, equals, value = arg.partition("=")
        if not equals:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                continue
            value = argv[i + 1]
        if value.endswith((".yaml", ".yml")) and Path(value).is_file():
            sources.append((f"{name} {value}", _yaml_or_none(Path(value).read_bytes())))
        elif value.lstrip().startswith(("{", "[")):
            sources.append((name, _yaml_or_none(value)))
        else:
            sources.append((name, value))
    return sources


def _yaml_or_none(text: str | bytes) -> Any:
    """``text`` as YAML; None when it is not (jsonargparse names what is wrong with it)."""
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, UnicodeDecodeError):
        return None


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
    check_trainer = getattr(cli.model, "check_trainer", None)  # settings the model cannot train under
    if check_trainer is not None:
        check_trainer(cli.trainer)
    harden_trainer(cli.trainer)
    quiet_trainer(cli.trainer)
    fitting = not cli.config.get("validate_only", False)
    try:
        tracker = tracker_spec(cli.config.get("tracker"))
    except ValueError as err:
        cli.parser.error(str(err))
    ckpt_path, resume_step = prepare_resume(cli.trainer, cli.model, cli.config.ckpt_path, fitting)
    if tracker is not None:
        attach_tracker(cli.trainer, tracker, cli.config.as_dict(), resume_step if fitting else None)
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


def run(cli: LightningCLI, stage: Literal["fit", "validate"], ckpt_path: str | None) -> Any:
    """``cli``'s stage in a run folder of its own (``mae.training.stage.run_stage``)."""
    return run_stage(cli.trainer, cli.model, cli.datamodule, stage, ckpt_path)


def fit(cli: LightningCLI, ckpt_path: str | None) -> None:
    """``run`` the fit, then print where the run's outputs are."""
    run(cli, "fit", ckpt_path)
    log_dir = Path(cli.trainer.log_dir or cli.trainer.default_root_dir)
    print_run_summary(cli.trainer, log_dir, (*FIGURES, (PredictionFigures, "predictions")))
