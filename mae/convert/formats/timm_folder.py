"""timm's hub folder: ``config.json`` (``architecture``, ``num_classes``, ``model_args``,
``pretrained_cfg``) and ``model.safetensors``, as timm's ``save_for_hf`` writes it, and so as
``mae export --to timm`` writes it (with a ``README.md`` card: ``mae.convert.folders``).

``write`` uses timm's own ``save_for_hf``, so that ``timm.create_model("local-dir:FOLDER", pretrained=True)``
(or ``hf-hub:USER/REPO`` once uploaded) builds the encoder, and ``timm.data.resolve_data_config`` +
``create_transform`` prepare images as our evaluation view does (resize the short side to
``size / crop_pct``, bicubic, centre crop, normalise). ``read`` takes the weights' architecture from
``model_args`` and the normalisation from ``pretrained_cfg`` (as ``mae_data``, so that every command
prepares images as the export recorded).
"""

import json
from pathlib import Path
from typing import Any

import timm
from timm.models import save_for_hf

from mae.convert.checkpoint import MAECheckpoint, check_finite
from mae.convert.classifier import Classifier, linear_head
from mae.convert.families import CNN_PREFIX
from mae.convert.formats.base import CheckpointFormat, CheckpointPath
from mae.convert.formats.huggingface import folder_weights
from mae.convert.shapes import infer_config
from mae.errors import ConfigError, InputError


def folder_config(folder: Path) -> dict | None:
    """The ``config.json`` of a timm hub folder (``architecture`` and ``pretrained_cfg``), or None for any
    other folder."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    is_timm = isinstance(config, dict) and "architecture" in config and "pretrained_cfg" in config
    return config if is_timm else None


def detect(checkpoint: CheckpointPath) -> bool:
    return checkpoint.path.is_dir() and folder_config(checkpoint.path) is not None


def read(checkpoint: CheckpointPath) -> MAECheckpoint:
    folder = checkpoint.path
    config = folder_config(folder)
    args = config.get("model_args") or {}
    state = folder_weights(folder)
    if "patch_embed.proj.weight" not in state:  # not a ViT: the timm model it names
        return _read_cnn(folder, config, state)
    hints = {k: args[k] for k in ("img_size", "num_heads") if k in args}
    ckpt_config, notes = infer_config(state, hints, folder)
    return MAECheckpoint(str(folder), "timm", state, ckpt_config, notes, data=_data_record(config))


# timm.create_model arguments a folder's model_args may hold that are not the encoder's own.
_NOT_ENCODER_ARGS = ("num_classes", "in_chans", "global_pool", "pretrained_cfg")


def _read_cnn(folder: Path, config: dict, state: dict) -> MAECheckpoint:
    """A timm folder of a CNN (``architecture`` a timm model without a patch embedding: ``resnet50``,
    ``convnextv2_atto``), in the CNN family's layout (``encoder.<timm key>``; its head, if any, kept).

    Raises:
        InputError: an ``architecture`` timm does not know, naming it and the folder.
    """
    architecture = config["architecture"]
    if not isinstance(architecture, str) or not timm.is_model(architecture):
        raise InputError(
            f"{folder}/config.json names architecture {architecture!r}, which timm {timm.__version__} does "
            "not know (and its weights have no ViT patch embedding)"
        )
    args = config.get("model_args") or {}
    data = _data_record(config)
    channels = args.get("in_chans") or (data or {}).get("in_chans") or 3
    size = (data or {}).get("img_size") or [224, 224]
    encoder_kwargs = {k: v for k, v in args.items() if k not in _NOT_ENCODER_ARGS}
    ckpt_config = {
        "family": "cnn",
        "encoder": architecture,
        "img_size": tuple(size),
        "in_chans": channels,
        "encoder_kwargs": encoder_kwargs,
    }
    prefixed = {f"{CNN_PREFIX}{k}": v for k, v in state.items()}
    return MAECheckpoint(str(folder), "timm", prefixed, ckpt_config, data=data, family="cnn")


def _data_record(config: dict) -> dict | None:
    """``pretrained_cfg``'s input size, mean and std as a ``mae_data`` record; None without them."""
    pretrained = config["pretrained_cfg"] if isinstance(config["pretrained_cfg"], dict) else {}
    if not {"mean", "std", "input_size"} <= pretrained.keys():
        return None
    channels, *size = pretrained["input_size"]
    return {
        "in_chans": channels,
        "img_size": list(size),
        "mean": list(pretrained["mean"]),
        "std": list(pretrained["std"]),
    }


def check(ckpt: MAECheckpoint) -> None:
    """Refuse an encoder a timm ``VisionTransformer`` would compute differently.

    Raises:
        ConfigError: a LayerNorm eps other than timm's 1e-6, naming the value.
    """
    if not ckpt.model_family.layer_norm_eps:  # a CNN: the timm model itself
        return
    eps = ckpt.config["layer_norm_eps"]
    if eps != 1e-6:
        raise ConfigError(
            f"{ckpt.source} uses LayerNorm eps {eps:g}; a timm ViT uses 1e-6, so its features would "
            "differ: export it with --to huggingface (which records eps), or use mae.load_backbone"
        )


def write(
    ckpt: MAECheckpoint,
    folder: Path,
    data_config: dict[str, Any],
    license: str | None,
    classifier: Classifier | None = None,
) -> None:
    """Write the encoder of ``ckpt`` into ``folder`` (an empty, new folder) in timm's hub layout; with
    ``classifier`` (``mae.convert.classifier.classifier_of(ckpt)``) the encoder with its head, which timm
    builds with ``num_classes`` and ``global_pool`` (a linear probe's BatchNorm folded into the head).

    ``data_config``: timm's preprocessing keys (``input_size`` (C, H, W), ``mean``, ``std``,
    ``interpolation``, ``crop_pct``, ``crop_mode``), stored in ``pretrained_cfg`` with the ``license``
    (in place of those of the timm model whose name builds it).
    """
    check(ckpt)
    family = ckpt.model_family
    args = family.timm_model_args(ckpt.config)
    state = ckpt.encoder_state_dict()
    state = ckpt.model_family.features_state(ckpt.config, state)  # a CNN classifier's head left out
    if classifier is not None:
        args.update(num_classes=classifier.num_classes, global_pool=classifier.global_pool)
        state = linear_head(state)
    model = timm.create_model(family.timm_architecture(ckpt.config), pretrained=False, **args)
    check_finite(state, ckpt.source)
    model.load_state_dict(state, strict=True)
    own = {"pretrained_cfg": {"tag": "mae", "license": license}}
    save_for_hf(model, str(folder), own, args, safe_serialization=True, data_config=data_config)


FORMAT = CheckpointFormat(
    name="timm folder (mae export --to timm, timm's save_for_hf)",
    format="timm",
    looks_for="a folder whose config.json has 'architecture' and 'pretrained_cfg'",
    detect=detect,
    read=read,
)
