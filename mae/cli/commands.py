"""The one table of the ``mae`` command's subcommands: name, where its ``main(argv)`` lives, and the one
line ``mae --help`` shows. Nothing here imports torch: ``mae --help`` reads this table alone, and a
subcommand's module is imported only once it is chosen."""

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Command:
    """``module``: where its ``main(argv: list[str] | None)`` and ``build_parser()`` live (under those
    names, or ``main`` / ``parser``); ``group``: its heading in ``mae --help``; ``recipes``: the recipe
    folders (``mae/configs/<folder>``) its ``--config NAME`` reads, first its own (training commands)."""

    name: str
    module: str
    summary: str
    group: str
    recipes: tuple[str, ...] = ()
    main: str = "main"
    parser: str = "build_parser"

    def load(self) -> Callable[[list[str] | None], Any]:
        """The command's ``main``."""
        return getattr(importlib.import_module(self.module), self.main)

    def build_parser(self) -> Any:
        """A fresh parser of the command (a jsonargparse ``ArgumentParser``), as ``main`` builds it."""
        return getattr(importlib.import_module(self.module), self.parser)()


TRAIN = (
    "Train (LightningCLI: every model, data and trainer key from a recipe, a YAML file or the command line)"
)
USE = "Evaluate and use a pretrained encoder"
DATA = "Data"
ABOUT = "About"

COMMANDS = (
    Command(
        "pretrain",
        "mae.cli.train",
        "MAE pretraining (mae pretrain --config default)",
        TRAIN,
        ("pretrain", "loggers", "strategy"),
    ),
    Command(
        "finetune",
        "mae.cli.finetune",
        "fine-tuning or linear probing of a pretrained encoder",
        TRAIN,
        ("finetune", "linprobe", "loggers", "strategy"),
    ),
    Command(
        "detect",
        "mae.cli.dense",
        "detection and instance segmentation (ViTDet's pyramid, torchvision's detectors)",
        TRAIN,
        ("detect", "loggers"),
        main="detect_main",
        parser="detect_parser",
    ),
    Command(
        "segment",
        "mae.cli.dense",
        "semantic segmentation (UperNet on the feature pyramid)",
        TRAIN,
        ("segment", "loggers"),
        main="segment_main",
        parser="segment_parser",
    ),
    Command("knn", "mae.cli.knn", "kNN accuracy of a pretrained encoder on a data module", USE),
    Command(
        "probe", "mae.cli.probe", "a converged linear probe of a pretrained encoder (cached features)", USE
    ),
    Command("export", "mae.cli.export", "the encoder as a plain timm ViT (.safetensors) or as ONNX", USE),
    Command(
        "embed", "mae.cli.embed", "embed images with an encoder into an index (Parquet, or .npy + CSV)", USE
    ),
    Command("search", "mae.cli.search", "the nearest images of an index to query images, as a figure", USE),
    Command("map", "mae.cli.map", "a 2-D t-SNE map of an index, coloured by label, as a figure", USE),
    Command("reconstruct", "mae.cli.reconstruct", "mask and reconstruct your images: a figure", USE),
    Command("anomaly", "mae.cli.anomaly", "anomaly scores and heat maps from the reconstruction error", USE),
    Command("demo", "mae.cli.demo", "a local page that reconstructs your images (needs the demo extra)", USE),
    Command("shard", "mae.cli.shard", "an image folder as streaming shards, local or on S3", DATA),
    Command(
        "stats", "mae.cli.stats", "per-channel mean and std of an image folder, as config lines", DATA
    ),
    Command(
        "recipes",
        "mae.cli.about",
        "the recipes shipped with the package, one line each",
        ABOUT,
        main="recipes_main",
        parser="recipes_parser",
    ),
    Command("replay", "mae.cli.replay", "replay a training step kept when it went non-finite", ABOUT),
    Command(
        "env",
        "mae.cli.about",
        "what a bug report needs: versions, device, bf16, default precision and attention",
        ABOUT,
        main="env_main",
        parser="env_parser",
    ),
    Command(
        "version",
        "mae.cli.about",
        "the installed version",
        ABOUT,
        main="version_main",
        parser="version_parser",
    ),
    Command(
        "completion",
        "mae.cli.about",
        "a bash or zsh completion script for mae",
        ABOUT,
        main="completion_main",
        parser="completion_parser",
    ),
)
BY_NAME = {command.name: command for command in COMMANDS}
