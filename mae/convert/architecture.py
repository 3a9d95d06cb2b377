"""The checkpoint contract: every checkpoint we write records the architecture it holds.

A checkpoint written by ``mae pretrain`` or ``mae finetune`` has, next to Lightning's own keys::

    checkpoint["mae_architecture"] = {
        "class": "MaskedAutoencoderViT" | "VisionTransformer",
        "args": {...},            # the constructor's keyword arguments (JSON types: tuples as lists)
        "layer_norm_eps": 1e-6,   # VisionTransformer only: eps of its LayerNorms (not an argument)
        "state_dict_prefix": "model." | "vit.",  # where the module's tensors sit in "state_dict"
    }

and, when the run's data module says how it normalises images (every one of ours does)::

    checkpoint["mae_data"] = {"in_chans": 3, "img_size": [224, 224], "mean": [...], "std": [...]}

so that tools given only the checkpoint (``mae reconstruct``, the demo page) prepare
images exactly as training did.

``MaskedAutoencoderViT`` args are its ``config``; ``VisionTransformer`` args are timm's (a linear-probe
classifier's head is a BatchNorm + linear, recorded as ``"head": "batchnorm_linear"``). A joint checkpoint
(``mae finetune`` mode joint: ``mae.training.joint.joint_record``) is a ``MaskedAutoencoderViT`` record whose
state also holds a classifier (``fc_norm.*``, ``head.*``: timm's global-average-pooling head), described
under ``"classifier": {"global_pool": "avg", "num_classes": K, "head": "linear"}``. Readers
rebuild the model from this record alone, once ``check_record`` has checked it against the tensors;
checkpoints written before the contract (version 0.1) are read through ``mae.convert.formats.lightning``'s
older path.
"""

import inspect
import math
from pathlib import Path
from typing import Any

import timm
import torch

from mae.convert.report import state_dict_mismatch
from mae.convert.shapes import infer_config
from mae.errors import ConfigError, InputError
from mae.models.cnn import MaskedAutoencoderCNN
from mae.models.factory import build_model
from mae.models.mae import MaskedAutoencoderViT

ARCHITECTURE_KEY = "mae_architecture"
DATA_KEY = "mae_data"
MAE_CLASS = "MaskedAutoencoderViT"
VIT_CLASS = "VisionTransformer"
CNN_MAE_CLASS = "MaskedAutoencoderCNN"
# A fine-tuned CNN classifier's record (``mae.training.finetune``): the timm CNN with its head.
CNN_CLASSIFIER_CLASS = "TimmCNN"

# VisionTransformer arguments that describe the encoder's weights (the rest: head and regularisation).
_ENCODER_VIT_ARGS = ("img_size", "patch_size", "in_chans", "embed_dim", "depth", "num_heads", "mlp_ratio")


def _jsonable(args: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in args.items()}


def mae_record(config: dict[str, Any], prefix: str = "model.") -> dict[str, Any]:
    """The record of a masked autoencoder with constructor arguments ``config``: a ``MaskedAutoencoderViT``,
    or a ``MaskedAutoencoderCNN`` when ``config`` names the family "cnn"."""
    cls = CNN_MAE_CLASS if config.get("family") == "cnn" else MAE_CLASS
    return {"class": cls, "args": _jsonable(config), "state_dict_prefix": prefix}


def vit_record(vit_args: dict[str, Any], layer_norm_eps: float, prefix: str = "vit.") -> dict[str, Any]:
    """The record of a timm ``VisionTransformer`` built with ``vit_args``."""
    return {
        "class": VIT_CLASS,
        "args": _jsonable(vit_args),
        "layer_norm_eps": layer_norm_eps,
        "state_dict_prefix": prefix,
    }


def encoder_config(record: dict[str, Any], source: str) -> dict[str, Any]:
    """``MaskedAutoencoderViT`` arguments of the model in ``record`` (for a classifier: its encoder;
    decoder arguments are then the defaults and unused).

    Raises:
        ValueError: a record of an unknown class or without the needed arguments, naming ``source``.
    """
    cls, args = record.get("class"), record.get("args") or {}
    if cls in (MAE_CLASS, CNN_MAE_CLASS):
        config = dict(args)
    elif cls == VIT_CLASS:
        missing = [k for k in _ENCODER_VIT_ARGS if k not in args]
        if missing:
            raise ConfigError(f"{source}: {ARCHITECTURE_KEY} lacks VisionTransformer arguments {missing}")
        config = {k: args[k] for k in _ENCODER_VIT_ARGS}
        config["layer_norm_eps"] = record.get("layer_norm_eps", 1e-6)
    elif cls == CNN_CLASSIFIER_CLASS:  # the CNN family's configuration, with the classifier's class count
        config = {
            "family": "cnn",
            "encoder": args.get("encoder"),
            "in_chans": args.get("in_chans", 3),
            "img_size": args.get("img_size", 224),
            "encoder_kwargs": dict(args.get("encoder_kwargs") or {}),
            "num_classes": args.get("num_classes", 0),
        }
    else:
        raise ConfigError(
            f"{source}: {ARCHITECTURE_KEY} names class {cls!r}; expected {MAE_CLASS!r}, {VIT_CLASS!r}, "
            f"{CNN_MAE_CLASS!r} or {CNN_CLASSIFIER_CLASS!r}"
        )
    config["img_size"] = (
        tuple(config["img_size"]) if isinstance(config.get("img_size"), list) else config["img_size"]
    )
    return config


def data_record(datamodule: Any) -> dict[str, Any] | None:
    """The ``mae_data`` entry of a data module with ``mean`` / ``std`` (None for other data)."""
    if not all(hasattr(datamodule, k) for k in ("mean", "std", "in_chans", "img_size")):
        return None
    size = datamodule.img_size
    return {
        "in_chans": datamodule.in_chans,
        "img_size": [size, size] if isinstance(size, int) else list(size),
        "mean": list(datamodule.mean),
        "std": list(datamodule.std),
    }


# The record's arguments that the tensors fix, and how to read them off the tensors (``infer_config``).
_SHAPE_ARGS = ("patch_size", "in_chans", "embed_dim", "depth", "mlp_ratio")
_DECODER_SHAPE_ARGS = ("decoder_embed_dim", "decoder_depth")


def check_record(config: dict[str, Any], state: dict[str, torch.Tensor], path: str | Path) -> None:
    """A checkpoint's architecture record against its own tensors, before any model is built from it
    (a damaged or edited record would otherwise build, say, a 2**20-wide model: terabytes).

    Raises:
        ValueError: naming ``path``: an argument ``MaskedAutoencoderViT`` does not take, a value of the
            wrong type, or an argument that disagrees with the tensors' shapes (both values given).
    """
    _check_record_types(config, path)
    measured, _ = infer_config(
        state, {"img_size": config.get("img_size"), "num_heads": 1, "decoder_num_heads": 1}, path
    )
    _check_record_shapes(config, measured, state, path)
    _check_record_grid(config.get("img_size"), measured["patch_size"], state["pos_embed"].shape[1] - 1, path)
    _check_target_width(config.get("target_options"), state, path)
    for heads, width_key in (("num_heads", "embed_dim"), ("decoder_num_heads", "decoder_embed_dim")):
        if heads in config and width_key in config and config[width_key] % config[heads]:
            raise InputError(
                f"{path}: its {ARCHITECTURE_KEY} record has {heads}={config[heads]}, which does not divide "
                f"{width_key}={config[width_key]}"
            )


def _image_sizes(size: Any) -> list:
    """A record's ``img_size`` as a list of one (H) or two (H, W) entries, unchecked."""
    return list(size) if isinstance(size, list | tuple) else [size]


def _check_record_types(config: dict[str, Any], path: str | Path) -> None:
    """Every argument one ``MaskedAutoencoderViT`` takes; sizes and counts positive integers."""
    known = set(inspect.signature(MaskedAutoencoderViT.__init__).parameters) - {"self"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record has arguments MaskedAutoencoderViT does not take: "
            f"{unknown} (it takes {sorted(known)}); the record is damaged or from another program"
        )
    for key in (
        "patch_size",
        "in_chans",
        "embed_dim",
        "depth",
        "num_heads",
        "decoder_embed_dim",
        "decoder_depth",
        "decoder_num_heads",
    ):
        value = config.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise InputError(
                f"{path}: its {ARCHITECTURE_KEY} record has {key}={value!r}; expected a positive integer"
            )
    size = config.get("img_size")
    sizes = _image_sizes(size)
    if len(sizes) not in (1, 2) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes
    ):
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record has img_size={size!r}; expected H or [H, W] pixels"
        )


def _check_record_shapes(
    config: dict[str, Any], measured: dict[str, Any], state: dict[str, torch.Tensor], path: str | Path
) -> None:
    """The record's widths, depths and decoder kind against those ``measured`` on the tensors."""
    keys = _SHAPE_ARGS + (_DECODER_SHAPE_ARGS if "decoder_embed.weight" in state else ())
    for key in keys:
        if key in config and not math.isclose(float(config[key]), float(measured[key])):
            raise InputError(
                f"{path}: its {ARCHITECTURE_KEY} record says {key}={config[key]!r}, but its tensors have "
                f"{key}={measured[key]!r}; the record is damaged or was edited"
            )
    if "decoder_embed.weight" in state and config.get("decoder_type", "self") != measured["decoder_type"]:
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record says "
            f"decoder_type={config.get('decoder_type', 'self')!r}, but its tensors are a "
            f"{measured['decoder_type']!r} decoder's; the record is damaged or was edited"
        )


def _check_target_width(options: Any, state: dict[str, torch.Tensor], path: str | Path) -> None:
    """A ``features`` record's target width (``target_options`` ``dim``, the teacher's) against the rows of
    ``decoder_pred`` (when the file has a decoder)."""
    if options is None:
        return
    dim = options.get("dim") if isinstance(options, dict) else None
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record has target_options={options!r}; expected a dict whose "
            "dim is a positive integer"
        )
    rows = state["decoder_pred.weight"].shape[0] if "decoder_pred.weight" in state else dim
    if rows != dim:
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record says target_options dim={dim}, but its decoder_pred "
            f"predicts {rows} values per patch; the record is damaged or was edited"
        )


def _check_record_grid(size: Any, patch: int, positions: int, path: str | Path) -> None:
    """The record's ``img_size`` cut into ``patch`` px patches gives the ``positions`` of ``pos_embed``."""
    sizes = _image_sizes(size)
    height, width = sizes * 2 if len(sizes) == 1 else sizes
    if height % patch or width % patch or (height // patch) * (width // patch) != positions:
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record says img_size={size!r}, but pos_embed holds {positions} "
            f"patch positions of {patch}x{patch} pixels; the record is damaged or was edited"
        )


def check_cnn_record(config: dict[str, Any], state: dict[str, torch.Tensor], path: str | Path) -> None:
    """A ``MaskedAutoencoderCNN`` record against the checkpoint's own tensors: the model it describes is
    built on the meta device (no memory: its widths come from the timm name, however damaged the record)
    and its tensor names and shapes compared with the file's.

    Raises:
        InputError: naming ``path``: an argument ``MaskedAutoencoderCNN`` does not take, an ``encoder`` timm
            does not know, arguments it refuses, or tensors that differ from the record's model (by name).
    """
    if "num_classes" in config:  # a fine-tuned classifier's (``TimmCNN``): the timm model with its head
        _check_cnn_classifier_record(config, state, path)
        return
    known = (set(inspect.signature(MaskedAutoencoderCNN.__init__).parameters) - {"self"}) | {"family"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record has arguments MaskedAutoencoderCNN does not take: "
            f"{unknown} (it takes {sorted(known)}); the record is damaged or from another program"
        )
    encoder = config.get("encoder")
    if not isinstance(encoder, str) or not timm.is_model(encoder):
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record names encoder {encoder!r}, which timm "
            f"{timm.__version__} does not know; the record is damaged, or the file needs another timm release"
        )
    try:
        with torch.device("meta"):
            own = build_model(**config).state_dict()
    except (ConfigError, TypeError, ValueError) as err:
        raise InputError(f"{path}: its {ARCHITECTURE_KEY} record builds no model: {err}") from None
    problems = state_dict_mismatch(own, state)
    if problems:
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record says a {encoder} MaskedAutoencoderCNN (decoder "
            f"{config.get('decoder', 'spark')!r}), but its tensors differ: "
            + "; ".join(problems)
            + "; the record is damaged or was edited"
        )


def _check_cnn_classifier_record(
    config: dict[str, Any], state: dict[str, torch.Tensor], path: str | Path
) -> None:
    """A ``TimmCNN`` record against its tensors (``encoder.<timm key>``): the timm model it names, built on
    the meta device, has the same tensors outside its classifier (a linear probe's head is a BatchNorm and
    a linear layer there)."""
    encoder = config.get("encoder")
    if not isinstance(encoder, str) or not timm.is_model(encoder):
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record names encoder {encoder!r}, which timm "
            f"{timm.__version__} does not know; the record is damaged, or the file needs another timm release"
        )
    with torch.device("meta"):
        model = timm.create_model(
            encoder, num_classes=0, in_chans=config["in_chans"], **config["encoder_kwargs"]
        )
    head = f"{model.pretrained_cfg['classifier']}."
    own = {f"encoder.{k}": v for k, v in model.state_dict().items() if not k.startswith(head)}
    given = {k: v for k, v in state.items() if not k.startswith(f"encoder.{head}")}
    problems = state_dict_mismatch(own, given)
    if problems:
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record says a {encoder} classifier, but its tensors differ: "
            + "; ".join(problems)
            + "; the record is damaged or was edited"
        )
