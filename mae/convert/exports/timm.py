"""The ``timm`` target: the encoder as timm's hub folder with a model card (``mae.convert.folders``; the
format: ``mae.convert.formats.timm_folder``), which ``timm.create_model("local-dir:DIR", pretrained=True)``
builds; a fine-tuned classifier with its head (``num_classes``, ``global_pool``), so that it computes the
same logits. Its own checks (a LayerNorm eps timm uses) and files (``config.json`` with the data config,
``model.safetensors``) are ``FOLDER``'s."""

from pathlib import Path

from mae.convert.checkpoint import MAECheckpoint
from mae.convert.classifier import Classifier
from mae.convert.exports.base import ExportRequest, ExportTarget
from mae.convert.folders import (
    FolderContents,
    FolderExport,
    FolderFormat,
    check_request,
    export_folder,
    folder_lines,
    folder_outputs,
)
from mae.convert.formats import timm_folder
from mae.convert.model_card import CardTarget, card_license

DEFAULT_CROP_PCT = 224 / 256  # our data modules' evaluation crop ratio unless the run set another


def check(ckpt: MAECheckpoint, encoder_only: bool) -> bool:
    """Refuse what a timm folder cannot hold (``timm_folder.check``); it holds the encoder alone."""
    timm_folder.check(ckpt)
    return False


def write(contents: FolderContents, folder: Path) -> None:
    """``config.json`` (the architecture, a classifier's ``num_classes`` and ``global_pool``, and timm's data
    config: input size, mean, std, the run's evaluation crop) and ``model.safetensors`` into ``folder``."""
    ckpt = contents.ckpt
    size = ckpt.config["img_size"]
    size = [size, size] if isinstance(size, int) else list(size)
    data_config = {
        "input_size": (ckpt.config["in_chans"], *size),
        "mean": tuple(contents.mean),
        "std": tuple(contents.std),
        "interpolation": "bicubic",
        "crop_pct": _crop_pct(contents.facts.run_config),
        "crop_mode": "center",
    }
    timm_folder.write(ckpt, folder, data_config, card_license(contents.facts), contents.classifier)


def card_usage(folder_name: str, has_decoder: bool) -> list[str]:
    """The card's code: timm loads the folder and computes the tokens."""
    return [
        "import timm",
        "",
        f'model = timm.create_model("local-dir:{folder_name}", pretrained=True)  # or hf-hub:USER/REPO',
        "config = timm.data.resolve_data_config({}, model=model)",
        "transform = timm.data.create_transform(**config)  # resize, centre crop, normalise as trained",
        "tokens = model.forward_features(transform(image).unsqueeze(0))  # (1, 1 + patches, width)",
    ]


def card_classifier_usage(folder_name: str, classifier: Classifier) -> list[str]:
    """The card's code for a classifier: timm builds it with its head and computes the class scores."""
    return [
        "import timm",
        "",
        f'model = timm.create_model("local-dir:{folder_name}", pretrained=True)  # or hf-hub:USER/REPO',
        "model.eval()",
        "config = timm.data.resolve_data_config({}, model=model)",
        "transform = timm.data.create_transform(**config)  # resize, centre crop, normalise as trained",
        f"logits = model(transform(image).unsqueeze(0))  # (1, {classifier.num_classes}) class scores",
    ]


CARD = CardTarget(library="timm", loaded_by="timm", usage=card_usage, classifier_usage=card_classifier_usage)
FOLDER = FolderFormat(name="timm", check=check, write=write, card=CARD)


def _crop_pct(run_config: dict | None) -> float:
    """The run's evaluation crop ratio (``data.init_args.eval_crop_ratio``), else our default."""
    init_args = ((run_config or {}).get("data") or {}).get("init_args") or {}
    return init_args.get("eval_crop_ratio") or DEFAULT_CROP_PCT


def export(request: ExportRequest) -> FolderExport:
    return export_folder(
        request.checkpoint, request.out, FOLDER, request.checkpoint_format, num_heads=request.num_heads
    )


def describe(export: FolderExport) -> list[str]:
    return folder_lines(
        export, f'load with timm: timm.create_model("local-dir:{export.folder}", pretrained=True)'
    )


TARGET = ExportTarget(
    name="timm",
    suffix=None,
    options={},
    applies="--to timm only",
    outputs=folder_outputs,
    export=export,
    describe=describe,
    check=check_request,
)
