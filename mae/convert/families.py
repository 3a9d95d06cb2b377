"""The model families a checkpoint can hold, one row each: the ViT (``MaskedAutoencoderViT``, timm's
``VisionTransformer``) and the CNN (``MaskedAutoencoderCNN`` on a timm ResNet / ConvNeXt). Everything that
differs between them when a checkpoint is read back, loaded or exported is a field of its ``ModelFamily``
row in ``MODEL_FAMILIES``, looked up by ``MAECheckpoint.family``; nothing else asks which family it has.

A checkpoint's family comes from its architecture record's class (``FAMILY_OF_CLASS``) or, for records
without a class (an exported encoder's ``mae`` record, a timm folder's configuration), from its
configuration (``family_of``). Files written before the CNN family are ViTs.

The CNN's state dict is the ``MaskedAutoencoderCNN``'s: ``encoder.<timm key>`` for the timm model, the
decoder's under ``decoder.``; a timm file or folder of the CNN alone is read into the same layout. Its
encoder part is then exactly a timm state dict of ``timm.create_model(encoder, num_classes=0)``.
"""

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from timm.models import get_pretrained_cfg_value

from mae.convert.architecture import (
    CNN_CLASSIFIER_CLASS,
    CNN_MAE_CLASS,
    MAE_CLASS,
    VIT_CLASS,
    check_cnn_record,
    check_record,
)
from mae.convert.timm_args import timm_architecture, timm_model_args
from mae.errors import ConfigError

CNN_PREFIX = "encoder."  # where a CNN checkpoint's timm tensors sit


@dataclass(frozen=True)
class ModelFamily:
    """What one family does differently (see the module doc).

    Attributes:
        name: "vit" or "cnn" (``MAECheckpoint.family``).
        described: the kind of network, in words, for messages and model cards.
        check_record: ``check_record(config, state, path)``: an architecture record against its tensors.
        encoder_state: the timm encoder's tensors (timm's names) of a checkpoint's state dict.
        has_decoder: whether a checkpoint's state dict holds a decoder.
        timm_architecture: the timm model name that builds the encoder of a config.
        timm_model_args: the ``timm.create_model`` arguments of that encoder, as features (no head).
        layer_norm_eps: whether the config's ``layer_norm_eps`` must be timm's for a timm export.
        refuses: export targets (``mae export --to``) the family cannot be written to, with why.
        backbone: ``load_backbone``'s work once the checkpoint is read (``mae.convert.backbone``).
        load_mae: ``load_mae``'s work once the checkpoint is read.
        init_from: ``init_mae_from(model, source, format)`` for a model of the family.
        features_state: ``features_state(config, state)``: the encoder's tensors as a feature extractor
            (no classifier) holds them, from ``encoder_state``'s: a CNN classifier's head left out.
        has_heads: whether its encoder has attention heads (``--num-heads`` applies).
    """

    name: str
    described: str
    check_record: Callable[[dict[str, Any], dict[str, torch.Tensor], str | Path], None]
    encoder_state: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
    has_decoder: Callable[[dict[str, torch.Tensor]], bool]
    timm_architecture: Callable[[dict[str, Any]], str]
    timm_model_args: Callable[[dict[str, Any]], dict[str, Any]]
    layer_norm_eps: bool
    refuses: Mapping[str, str]
    backbone: Callable[..., Any]
    load_mae: Callable[..., Any]
    init_from: Callable[..., Any]
    features_state: Callable[[dict[str, Any], dict[str, torch.Tensor]], dict[str, torch.Tensor]]
    has_heads: bool


def _later(module: str, name: str) -> Callable[..., Any]:
    """``module.name``, imported at the first call: the loaders sit above the readers that use this table."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = name
    return call


def _vit_encoder_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The timm ``VisionTransformer`` part: everything but ``mask_token`` and ``decoder_*``."""
    return {k: v for k, v in state.items() if not (k.startswith("decoder") or k == "mask_token")}


def _cnn_encoder_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The timm CNN: the ``encoder.`` tensors, without the prefix."""
    return {k[len(CNN_PREFIX) :]: v for k, v in state.items() if k.startswith(CNN_PREFIX)}


def cnn_timm_model_args(config: dict[str, Any]) -> dict[str, Any]:
    """``timm.create_model`` arguments of a CNN config's encoder as features: ``num_classes=0``, its input
    channels and the timm arguments it was built with (``encoder_kwargs``)."""
    return {**(config.get("encoder_kwargs") or {}), "num_classes": 0, "in_chans": config["in_chans"]}


def cnn_features_state(config: dict[str, Any], state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A CNN encoder's timm tensors without its classifier (``pretrained_cfg["classifier"]``: a fine-tuned
    classifier's head): the features, as ``timm.create_model(encoder, num_classes=0)`` holds them."""
    head = f"{get_pretrained_cfg_value(config['encoder'], 'classifier')}."
    return {k: v for k, v in state.items() if not k.startswith(head)}


MODEL_FAMILIES: dict[str, ModelFamily] = {
    "vit": ModelFamily(
        name="vit",
        described="Vision Transformer",
        check_record=check_record,
        encoder_state=_vit_encoder_state,
        has_decoder=lambda state: "decoder_embed.weight" in state,
        timm_architecture=timm_architecture,
        timm_model_args=timm_model_args,
        layer_norm_eps=True,
        refuses={},
        backbone=_later("mae.convert.backbone", "vit_backbone"),
        load_mae=_later("mae.convert.backbone", "vit_mae"),
        init_from=_later("mae.convert.backbone", "init_vit_mae_from"),
        features_state=lambda config, state: state,
        has_heads=True,
    ),
    "cnn": ModelFamily(
        name="cnn",
        described="convolutional network",
        check_record=check_cnn_record,
        encoder_state=_cnn_encoder_state,
        has_decoder=lambda state: any(not k.startswith(CNN_PREFIX) for k in state),
        timm_architecture=lambda config: config["encoder"],
        timm_model_args=cnn_timm_model_args,
        layer_norm_eps=False,
        refuses={
            "huggingface": "--to huggingface writes a transformers ViTMAE folder, and transformers has no "
            "MAE model of a CNN: export it with --to timm (a folder timm loads) or --out X.safetensors",
        },
        backbone=_later("mae.convert.cnn_loading", "cnn_backbone"),
        load_mae=_later("mae.convert.cnn_loading", "cnn_mae"),
        init_from=_later("mae.convert.cnn_loading", "init_cnn_mae_from"),
        features_state=cnn_features_state,
        has_heads=False,
    ),
}
# The family of each class an architecture record (``mae_architecture``) names.
FAMILY_OF_CLASS = {MAE_CLASS: "vit", VIT_CLASS: "vit", CNN_MAE_CLASS: "cnn", CNN_CLASSIFIER_CLASS: "cnn"}
# The record classes whose tensors are the timm model's own names (prefixed with ``encoder.`` when read).
TIMM_LAYOUT_CLASSES = (CNN_CLASSIFIER_CLASS,)


def family_of(config: dict[str, Any]) -> str:
    """The family of a model configuration without a record class: the one it names (``family``), else
    "cnn" when it names a timm encoder (a CNN classifier's record), else "vit" (every file before 0.5.0)."""
    return config.get("family") or ("cnn" if "encoder" in config else "vit")


def check_num_heads(ckpt: Any, num_heads: int | None) -> None:
    """Raise ``ConfigError`` when ``--num-heads`` is given for a checkpoint (``MAECheckpoint``) of a family
    without attention heads."""
    if num_heads is not None and not ckpt.model_family.has_heads:
        raise ConfigError(
            f"--num-heads is a ViT's; {ckpt.source} holds the {ckpt.model_family.name.upper()} "
            f"{ckpt.config.get('encoder')}, which has no attention heads: leave --num-heads out"
        )
