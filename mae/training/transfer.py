"""The base of every module that trains on a pretrained encoder (fine-tuning and linear probing,
detection, segmentation): the settings they share, written once, checked once, and the encoder they
start from.

LightningCLI reads these settings through each subclass's ``**kwargs`` (jsonargparse follows them to
this signature), so every transfer takes the same keys (``model.encoder.checkpoint``, ``model.optim.base_lr``,
``model.layer_decay``, ...) and a new shared option is added here alone. A subclass restates a setting
only to give it its task's default (e.g. its own ``optim`` group).

A trained module rebuilds itself with Lightning's own ``load_from_checkpoint``: its hyperparameters
record the encoder's architecture (``encoder_config``), filled in when the encoder is first built, so
the pretraining file named by ``model.encoder.checkpoint`` is read once, when training starts, and
never again.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import timm
import torch
from lightning.pytorch.utilities import rank_zero_info
from timm.layers import to_2tuple
from torch import nn

from mae.convert.architecture import DATA_KEY
from mae.convert.backbone import build_vit, load_backbone, pooling_of
from mae.convert.families import family_of
from mae.convert.sharded_checkpoint import read_training_checkpoint
from mae.convert.sources import MAECheckpoint, read_checkpoint
from mae.errors import ConfigError, MissingFileError, check_at_least
from mae.models import create_model
from mae.training.base import MAETrainingModule
from mae.training.settings import (
    FINETUNE_OPTIM,
    TRANSFER_KERNELS,
    KernelChoices,
    OptimSettings,
    as_group,
    settings_kwargs_v0_2,
)

# Where version 0.2 kept the encoder's architecture in a trained checkpoint: beside its hyperparameters.
ENCODER_KEY_V0_2 = "mae_encoder_config"
# Arguments a ViT encoder takes and a CNN has no use for: a CNN takes inputs of any size as it is.
_VIT_ONLY = ("dynamic_img_size",)


def check_cnn_pool(global_pool: str | None, encoder: str) -> None:
    """Raises ConfigError when ``global_pool`` (None: the default) is not "avg" for the CNN ``encoder``."""
    if global_pool not in (None, "avg"):
        raise ConfigError(
            f"model.global_pool {global_pool!r} pools a ViT's cls token; {encoder} is a CNN, which has "
            "none: use model.global_pool avg (the mean of its last map, timm's own pooling)"
        )


def build_cnn(
    config: dict[str, Any],
    in_chans: int,
    global_pool: str | None = None,
    num_classes: int = 0,
    **timm_kwargs: Any,
) -> nn.Module:
    """A freshly initialised timm CNN of the encoder in ``config`` (``encoder``: the timm name, and the
    pretraining's ``encoder_kwargs``), taking ``in_chans`` channels, average-pooled, with a new
    ``num_classes`` head (0: none); ``timm_kwargs`` (``drop_path_rate``, ...) go to ``timm.create_model``."""
    check_cnn_pool(global_pool, config["encoder"])
    for name in _VIT_ONLY:
        timm_kwargs.pop(name, None)
    kwargs = {**config.get("encoder_kwargs", {}), **timm_kwargs}
    return timm.create_model(
        config["encoder"],
        pretrained=False,
        num_classes=num_classes,
        in_chans=in_chans,
        global_pool="avg",
        **kwargs,
    )


def check_checkpoint_exists(checkpoint: str | None) -> None:
    """Raises MissingFileError when ``checkpoint`` is set and missing, naming ``model.encoder.checkpoint``
    and the two ways to go on: pretrain first, or start from a random encoder."""
    if checkpoint is not None and not Path(checkpoint).exists():
        raise MissingFileError(
            f"model.encoder.checkpoint {checkpoint} does not exist: point it at pretrained weights (for the "
            "default config, run `mae pretrain --config default` first) or set it to null to train from a "
            "random initialisation"
        )


@dataclass(frozen=True)
class EncoderSource:
    """``model.encoder``: where a transfer's encoder comes from: the pretrained weights in ``checkpoint``
    (ours, an export, official MAE, timm or Hugging Face; see ``mae.load_backbone``; ``checkpoint_format``:
    "auto" or a format name of ``mae.convert.sources.FORMATS``), else (``checkpoint`` None) a fresh encoder
    of the MAE size ``model`` (e.g. "mae_vit_base_patch16") with the ``MaskedAutoencoderViT`` overrides
    ``model_kwargs`` (e.g. depth); for a CNN, ``model`` "spark" or "fcmae" with the
    ``MaskedAutoencoderCNN`` overrides (e.g. ``{encoder: resnet10t}``): the same timm CNN at random
    initialisation, for the pretrained-vs-scratch comparison."""

    checkpoint: str | None = None
    checkpoint_format: str = "auto"
    model: str = "mae_vit_base_patch16"
    model_kwargs: dict[str, Any] | None = None

    def build(
        self,
        img_size: int | tuple[int, int],
        in_chans: int,
        record: dict[str, Any] | None = None,
        global_pool: str | None = None,
        **vit_kwargs: Any,
    ) -> tuple[nn.Module, dict[str, Any], MAECheckpoint | None]:
        """The encoder as a timm model at ``img_size`` with ``vit_kwargs`` (a ViT, or the timm CNN itself
        for a CNN encoder, which takes any input size: ``dynamic_img_size`` is left out for it), its
        config (MAE arguments, ``family_of`` tells which) and the read checkpoint (None unless built
        from ``checkpoint``, which is then read once and its load report logged). ``record``: the
        encoder's recorded architecture (a trained module's ``encoder_config``); when given, the encoder
        is built from it alone (every weight then comes from the trained checkpoint's state dict).
        ``global_pool``: None loads every norm the checkpoint holds (``pooling_of``; "token" otherwise);
        a CNN pools "avg" only.

        Raises:
            MissingFileError: ``checkpoint`` is needed and does not exist, naming
                ``model.encoder.checkpoint``.
            ConfigError: a ``global_pool`` other than "avg" for a CNN.
        """
        if record is not None:
            return self._fresh(record, img_size, in_chans, global_pool, vit_kwargs), dict(record), None
        check_checkpoint_exists(self.checkpoint)
        if self.checkpoint is None:
            with torch.device("meta"):
                sized = create_model(
                    self.model, img_size=img_size, in_chans=in_chans, **(self.model_kwargs or {})
                )
            return self._fresh(sized.config, img_size, in_chans, global_pool, vit_kwargs), sized.config, None
        ckpt = read_checkpoint(self.checkpoint, self.checkpoint_format)
        if ckpt.family == "cnn":
            check_cnn_pool(global_pool, ckpt.config["encoder"])
            global_pool = "avg"
            for name in _VIT_ONLY:
                vit_kwargs.pop(name, None)
        vit = load_backbone(ckpt, img_size, global_pool or pooling_of(ckpt), in_chans=in_chans, **vit_kwargs)
        rank_zero_info(str(vit.load_report))
        return vit, vit.load_report.config, ckpt

    @staticmethod
    def _fresh(
        config: dict[str, Any],
        img_size: int | tuple[int, int],
        in_chans: int,
        global_pool: str | None,
        vit_kwargs: dict[str, Any],
    ) -> nn.Module:
        """A randomly initialised encoder of the architecture ``config``: a timm ViT, or the timm CNN."""
        if family_of(config) == "cnn":
            return build_cnn(config, in_chans, global_pool, **vit_kwargs)
        return build_vit(config, img_size, global_pool or "token", **vit_kwargs)


def encoder_record(config: dict[str, Any], in_chans: int) -> dict[str, Any]:
    """The ``encoder_config`` hyperparameter of an encoder with MAE ``config`` taking ``in_chans``
    channels: plain values (lists, not tuples), as a checkpoint and a YAML file hold them."""
    record = {key: list(value) if isinstance(value, tuple) else value for key, value in config.items()}
    record["img_size"] = list(to_2tuple(config["img_size"]))
    record["in_chans"] = in_chans
    return record


class TransferModule(MAETrainingModule):
    """A network trained from a pretrained MAE encoder (or the same encoder freshly initialised).

    Every argument is kept where it is used: the encoder's origin in ``self.encoder_source``, the
    optimiser and kernel choices in ``self.optim`` / ``self.kernels``, the rest as attributes of the
    same names.

    Args:
        encoder: where the encoder comes from (``EncoderSource``): pretrained weights (``checkpoint``), or
            None there for a random encoder of the size ``model``.
        img_size: input size; linked from ``data.img_size`` (position embeddings are resampled when it
            differs from the pretraining size).
        in_chans: image channels; linked from ``data.in_chans`` (the patch embedding of a checkpoint with
            another count is adapted, ``mae.convert.backbone.adapt_patch_embed``).
        num_classes: linked from the data module.
        drop_path_rate: stochastic depth in the encoder (paper: 0.1 B, 0.2 L, 0.3 H).
        layer_decay: layer-wise lr decay on the encoder, in (0, 1] (paper: 0.65 B, 0.75 L/H); 1 disables it.
        optim: the optimiser and its schedule (``mae.training.settings.OptimSettings``; the paper's
            fine-tuning: base_lr 5e-4 per 256 images (1e-3 L/H; linear probe 0.1), min_lr 1e-6 (linear
            probe 0), warmup_epochs 5 (linear probe 10), weight_decay 0.05 (linear probe 0)).
        kernels: the kernel choices (``mae.training.settings.KernelChoices``): compile off by default
            ("auto" as for pretraining), attention and fused_adamw "auto".
        grad_checkpointing: activation checkpointing of every encoder block (timm's
            ``set_grad_checkpointing``; the dense tasks' pyramid runs its blocks checkpointed): far less
            activation memory for about a third more step time; the same losses and gradients.
        encoder_config: the encoder's architecture (``MaskedAutoencoderViT`` arguments; a CNN's
            ``MaskedAutoencoderCNN`` arguments, naming its timm ``encoder``). Leave it None: the
            module fills it in from ``encoder`` when it builds the encoder, and its checkpoints record it,
            so that ``load_from_checkpoint`` builds the same encoder (its weights from the checkpoint's
            state dict) without reading ``encoder.checkpoint`` again. When set, ``encoder`` is not read.
    """

    num_classes_rule = "a classifier"  # what the two classes at least are, for the error message

    def __init__(
        self,
        encoder: EncoderSource = EncoderSource(),
        img_size: int | tuple[int, int] = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        drop_path_rate: float = 0.1,
        layer_decay: float = 0.65,
        optim: OptimSettings = FINETUNE_OPTIM,
        kernels: KernelChoices = TRANSFER_KERNELS,
        encoder_config: dict[str, Any] | None = None,
        grad_checkpointing: bool = False,
    ) -> None:
        super().__init__(as_group(optim, FINETUNE_OPTIM), as_group(kernels, TRANSFER_KERNELS))
        self.encoder_source = as_group(encoder, EncoderSource())
        self.save_settings(
            encoder=self.encoder_source
        )  # with the subclasses' own arguments: Lightning reads every __init__ frame
        if not 0 < layer_decay <= 1:
            raise ConfigError(f"model.layer_decay must be in (0, 1], got {layer_decay}")
        check_at_least("model.num_classes", num_classes, 2, rule=self.num_classes_rule)
        self.encoder_config = encoder_config
        self.img_size = img_size
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.drop_path_rate = drop_path_rate
        self.layer_decay = layer_decay
        self.grad_checkpointing = grad_checkpointing

    def pretrained_vit(
        self, global_pool: str | None = None, **vit_kwargs: Any
    ) -> tuple[nn.Module, dict[str, Any], MAECheckpoint | None]:
        """The encoder at ``img_size`` with ``vit_kwargs`` (``EncoderSource.build``), its MAE config and
        the read checkpoint; records its architecture in the hyperparameters (``encoder_config``)."""
        vit, config, ckpt = self.encoder_source.build(
            self.img_size, self.in_chans, self.encoder_config, global_pool, **vit_kwargs
        )
        self.encoder_config = self.hparams.encoder_config = encoder_record(config, self.in_chans)
        vit.set_grad_checkpointing(self.grad_checkpointing)
        return vit, config, ckpt


def restore_kwargs_v0_2(path: str | Path) -> dict[str, Any]:
    """What ``load_from_checkpoint`` needs beyond the hyperparameters of a checkpoint written before 0.3.0:
    ``Module.load_from_checkpoint(path, **restore_kwargs_v0_2(path))`` then loads it (any module of this
    package; a transfer's without its pretraining file). Such a checkpoint recorded its settings as flat
    keys (``base_lr``, ``checkpoint``, ...: ``mae.training.settings.settings_kwargs_v0_2`` moves them into
    their groups), and version 0.2 kept a transfer's encoder architecture (and a dense module's input
    normalisation) beside its hyperparameters. A detection or segmentation checkpoint of 0.3.0 named
    ``grad_checkpointing`` ``activation_checkpointing``: renamed the same way. Empty for a checkpoint of
    0.4.0 or later."""
    saved = read_training_checkpoint(path, model_only=True)
    settings = saved.get("hyper_parameters", {})
    restore = settings_kwargs_v0_2(settings)
    if "encoder_config" in settings or ENCODER_KEY_V0_2 not in saved:
        return restore
    # A module with input normalisation settings (the dense ones) recorded what it resolved in mae_data.
    data = saved.get(DATA_KEY) or {}
    resolved = {key: data[key] for key in ("mean", "std") if key in settings and key in data}
    return {**restore, "encoder_config": saved[ENCODER_KEY_V0_2], **resolved}
