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
    names, or ``<name>_main`` / ``<name>_parser`` in a module that ``shares_module``); ``group``: its
    heading in ``mae --help``; ``recipes``: the recipe folders (``mae/configs/<folder>``) its ``--config
    NAME`` reads, first its own (training commands)."""

    name: str
    module: str
    summary: str
    group: str
    recipes: tuple[str, ...] = ()
    shares_module: bool = False  # its module holds other commands too: ``<name>_main``, ``<name>_parser``

    def load(self) -> Callable[[list[str] | None], Any]:
        """The command's ``main``."""
        return getattr(
            importlib.import_module(self.module), f"{self.name}_main" if self.shares_module else "main"
        )

    def build_parser(self) -> Any:
        """A fresh parser of the command (a jsonargparse ``ArgumentParser``), as ``main`` builds it."""
        name = f"{self.name}_parser" if self.shares_module else "build_parser"
        return getattr(importlib.import_module(self.module), name)()


TRAIN = (
    "Train (LightningCLI: every model, data and trainer key from a recipe, a YAML file or the command line)"
)
USE = "Evaluate and use a pretrained encoder"
DATA = "Data"
DEBUG = "Debug a training run"
ABOUT = "About"

COMMANDS = (
    Command(
        "pretrain",
        "mae.cli.train",
        "MAE pretraining from a recipe (mae pretrain --config default); --find_batch_size: the largest "
        "batch that fits",
        TRAIN,
        ("pretrain", "loggers", "strategy"),
    ),
    Command(
        "distill",
        "mae.cli.distill",
        "TinyMIM relation distillation of a frozen teacher into a plain timm ViT student (ViT-T/S/B)",
        TRAIN,
        ("distill", "loggers", "strategy"),
    ),
    Command(
        "finetune",
        "mae.cli.finetune",
        "fine-tuning or linear probing of a pretrained encoder (or only evaluating the result)",
        TRAIN,
        ("finetune", "linprobe", "loggers", "strategy"),
    ),
    Command(
        "detect",
        "mae.cli.dense",
        "detection and instance segmentation on ViTDet's pyramid (torchvision's detectors), COCO mAP",
        TRAIN,
        ("detect", "loggers"),
        shares_module=True,
    ),
    Command(
        "segment",
        "mae.cli.dense",
        "semantic segmentation (UperNet on the feature pyramid): mIoU",
        TRAIN,
        ("segment", "loggers"),
        shares_module=True,
    ),
    Command("knn", "mae.cli.knn", "kNN accuracy of a pretrained encoder on a data module", USE),
    Command(
        "probe", "mae.cli.probe", "a converged linear probe of a pretrained encoder (cached features)", USE
    ),
    Command(
        "export",
        "mae.cli.export",
        "the encoder for other libraries: a timm .safetensors file, a timm or Hugging Face folder, or ONNX "
        "checked with onnxruntime",
        USE,
    ),
    Command(
        "embed",
        "mae.cli.embed",
        "embed images into an index (Parquet, or .npy + CSV), resumable; --map also draws its t-SNE map",
        USE,
    ),
    Command("search", "mae.cli.search", "the nearest images of an index to query images, as a figure", USE),
    Command("map", "mae.cli.map", "a 2-D t-SNE map of an index, coloured by label, as a figure", USE),
    Command(
        "reconstruct",
        "mae.cli.reconstruct",
        "mask and reconstruct your images, with --attention the cls attention maps: a figure",
        USE,
    ),
    Command(
        "anomaly",
        "mae.cli.anomaly",
        "anomaly scores and heat maps: MAE reconstruction error, pixel kNN or a feature memory "
        "(PatchCore-style); saved scorers, MVTec AD metrics",
        USE,
    ),
    Command(
        "demo",
        "mae.cli.demo",
        "a local page that reconstructs your images; with --index, a tab of similar images (demo extra)",
        USE,
    ),
    Command("shard", "mae.cli.shard", "an image folder as streaming shards, local or on S3", DATA),
    Command("stats", "mae.cli.stats", "per-channel mean and std of an image folder, as config lines", DATA),
    Command(
        "replay",
        "mae.cli.replay",
        "rerun a training step kept when it went non-finite, naming the first module that made a NaN/inf",
        DEBUG,
    ),
    Command(
        "recipes",
        "mae.cli.about",
        "the recipes shipped with the package, one line each",
        ABOUT,
        shares_module=True,
    ),
    Command(
        "env",
        "mae.cli.about",
        "what a bug report needs: versions, device, bf16, default precision and attention",
        ABOUT,
        shares_module=True,
    ),
    Command(
        "version",
        "mae.cli.about",
        "the installed version",
        ABOUT,
        shares_module=True,
    ),
    Command(
        "completion",
        "mae.cli.about",
        "a bash or zsh completion script for mae",
        ABOUT,
        shares_module=True,
    ),
)
BY_NAME = {command.name: command for command in COMMANDS}
