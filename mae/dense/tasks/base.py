"""What the detection and segmentation modules share: the pretrained encoder under a feature pyramid,
the input normalisation, and the fine-tuning recipe's parameter groups (layer-wise lr decay on the
encoder, the pyramid and heads at the full lr)."""

from typing import Any

import torch
from timm.layers import to_2tuple
from timm.optim import param_groups_layer_decay
from torch import nn

from mae.convert.families import family_of
from mae.data.views.normalize import normalization
from mae.dense.models.cnn_pyramid import CNNFeaturePyramid
from mae.dense.models.pyramid import SCALES, SimpleFeaturePyramid, check_cnn_pyramid_args, default_max_tokens
from mae.errors import ConfigError
from mae.training.optim import ParamGroupPlan
from mae.training.settings import refuse_renamed_arguments
from mae.training.transfer import TransferModule

DENSE_CLASS = "SimpleFeaturePyramid"  # the architecture record's class: an encoder under a pyramid and heads


def input_normalization(
    data: dict[str, Any] | None, in_chans: int, mean: list[float] | None, std: list[float] | None
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) per channel of the encoder's inputs: as given, else as the pretraining run recorded
    (``data``, its checkpoint's ``mae_data``), else ImageNet's for RGB."""
    if mean is None and std is None and data is not None and data.get("in_chans") == in_chans:
        return tuple(data["mean"]), tuple(data["std"])
    return normalization(in_chans, mean, std)


def layer_decay_groups(
    network: nn.Module, vit: nn.Module, weight_decay: float, layer_decay: float
) -> list[dict]:
    """Optimizer groups of ``network``: its encoder ``vit`` with layer-wise lr decay (timm's groups: the
    last block at ``layer_decay``, each block below one more factor, the embeddings the most, as ViTDet
    and BEiT do; a CNN's blocks as its ``group_matcher`` counts them, a ResNet's ``layerN.M``, a ConvNeXt's
    ``stages.N.blocks.M`` and downsamplings, the stem the lowest), every other parameter (pyramid, heads)
    at the full lr; weight decay on weights only."""
    no_weight_decay = getattr(vit, "no_weight_decay", set)()  # a CNN has none: its 1-D weights are skipped
    groups = param_groups_layer_decay(
        vit, weight_decay, no_weight_decay_list=no_weight_decay, layer_decay=layer_decay
    )
    for group in groups:
        # timm counts layers up to the encoder's last parametrised one; the pyramid's encoder has lost its
        # final norm (a CNN's: its head), which timm would put above the last block. One more factor keeps
        # the last block at layer_decay.
        group["lr_scale"] *= layer_decay
    in_vit = {id(p) for p in vit.parameters()}
    rest = [(name, p) for name, p in network.named_parameters() if id(p) not in in_vit and p.requires_grad]
    for decayed in (True, False):
        params = [p for name, p in rest if (p.ndim > 1 and not name.endswith(".bias")) == decayed]
        if params:
            groups.append(
                {
                    "params": params,
                    "weight_decay": weight_decay if decayed else 0.0,
                    "lr_scale": 1.0,
                    "name": "heads_decay" if decayed else "heads_no_decay",
                }
            )
    for index, group in enumerate(groups):
        group.pop("param_names", None)
        group.setdefault("name", f"encoder_{index}")
    return groups


class DenseTrainingModule(TransferModule):
    """Base of ``MAEDetectionModule`` and ``MAESegmentationModule``: the pretrained encoder under a
    ``SimpleFeaturePyramid`` (``self.pyramid``) and the input normalisation (``self.mean`` / ``self.std``),
    built here; a subclass builds its network around the pyramid, then calls ``plan_param_groups``.
    Images enter in [0, 1] and are normalised by the network.

    Args:
        out_channels, block, window_size, global_blocks, relative_position, scales: the pyramid's
            (``mae.dense.models.pyramid.SimpleFeaturePyramid``; ViTDet ViT-B: 256, last block, window 14,
            global blocks 2, 5, 8, 11, relative positions on); kept in ``self.pyramid_args``, with its
            ``grad_checkpointing`` (``TransferModule``'s, the name every task shares). Its name until 0.4.0,
            ``activation_checkpointing``, is refused naming it (``mae.training.settings.RENAMES``).
        mean, std: input normalisation; None: the pretraining run's (from the checkpoint), else ImageNet's.
            The module's hyperparameters record the values it resolved, so a trained checkpoint needs no
            pretraining file for them either.
        **kwargs: passed on whole to ``TransferModule`` (the encoder, input, classes, optimiser and kernel
            settings: encoder, img_size, num_classes, layer_decay, optim, kernels, ...); each task states its
            own ``optim`` defaults.
    """

    num_classes_rule = "background or one class, and one more"
    # Hyperparameters the module fills in when it builds: not settings a config chose, so not named when a
    # checkpoint does not fit.
    RESOLVED_AT_BUILD = ("encoder_config", "mean", "std")
    pyramid: SimpleFeaturePyramid | CNNFeaturePyramid

    def __init__(
        self,
        out_channels: int = 256,
        block: int | list[int] | None = None,
        window_size: int | None = None,
        global_blocks: list[int] | None = None,
        relative_position: bool = False,
        scales: list[float] | None = None,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        **kwargs: Any,
    ) -> None:
        refuse_renamed_arguments(kwargs, type(self))
        super().__init__(**kwargs)
        self.pyramid_args = dict(
            out_channels=out_channels,
            block=block,
            window_size=window_size,
            global_blocks=global_blocks,
            relative_position=relative_position,
            grad_checkpointing=self.grad_checkpointing,
            scales=tuple(scales or SCALES),
        )
        self.given_mean, self.given_std = mean, std

    def build_encoder(self) -> None:
        """``self.pyramid``: the encoder (``TransferModule.pretrained_vit``, any input size) under the
        pyramid of its family (a ViT's ``SimpleFeaturePyramid``, a CNN's ``CNNFeaturePyramid``, which
        refuses the ViT pyramid's settings by name); ``self.mean`` / ``self.std``: ``model.mean`` /
        ``model.std``, or the pretraining run's (``input_normalization``), recorded in the hyperparameters."""
        vit, config, ckpt = self.pretrained_vit(dynamic_img_size=True, drop_path_rate=self.drop_path_rate)
        if family_of(config) == "cnn":
            check_cnn_pyramid_args(self.pyramid_args, config["encoder"])
            self.pyramid = CNNFeaturePyramid(
                vit,
                self.pyramid_args["out_channels"],
                self.grad_checkpointing,
                pretraining_size=to_2tuple((ckpt.config if ckpt else config)["img_size"]),
            )
        else:
            self.pyramid = SimpleFeaturePyramid(vit, **self.pyramid_args, max_tokens=self._largest_input(vit))
        self.mean, self.std = input_normalization(
            ckpt and ckpt.data, self.in_chans, self.given_mean, self.given_std
        )
        self.hparams.mean, self.hparams.std = list(self.mean), list(self.std)

    def _largest_input(self, vit: nn.Module) -> int:
        """The pyramid's ``max_tokens``: its default, or the patches of the largest input this module feeds
        it if more (``img_size`` on each side, padded to a multiple of 32 as torchvision batches images)."""
        side = -(-max(to_2tuple(self.img_size)) // 32) * 32
        patch = vit.patch_embed.patch_size[0]
        return max(default_max_tokens(vit), (-(-side // patch)) ** 2)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint of a network built otherwise (``--ckpt_path`` under another config) before
        Lightning's strict load would, naming the settings that differ rather than only tensor names.

        Raises:
            ValueError: the checkpoint's tensors do not fit this network: the first mismatched names and
                every ``model.*`` setting whose value differs from the checkpoint's.
        """
        super().on_load_checkpoint(checkpoint)
        ours = {name: tuple(t.shape) for name, t in self.state_dict().items()}
        theirs = {name: tuple(t.shape) for name, t in checkpoint.get("state_dict", {}).items()}
        if ours == theirs or not self.strict_loading:  # a module set to load loosely keeps Lightning's way
            return
        reshaped = sorted(name for name in set(ours) & set(theirs) if ours[name] != theirs[name])
        mismatched = sorted(set(ours) ^ set(theirs)) + reshaped
        saved = checkpoint.get("hyper_parameters", {})
        differ = [
            f"model.{k}: {saved[k]!r} there, {v!r} here"
            for k, v in self.hparams.items()
            if k in saved and saved[k] != v and k not in self.RESOLVED_AT_BUILD
        ]
        raise ConfigError(
            f"the checkpoint's network does not fit this config's ({len(mismatched)} tensors missing, extra "
            f"or of another shape, e.g. {', '.join(mismatched[:3])}); settings that differ from the "
            f"checkpoint's: {'; '.join(differ) or 'none recorded'}. Use the checkpoint's values for the "
            "settings that shape the network (relative_position, window_size, block, scales, out_channels, "
            "head_channels, detector, model)"
        )

    def plan_param_groups(self) -> None:
        """The parameter groups, fixed by name now (a strategy may wrap the parameters later)."""
        groups = layer_decay_groups(
            self.network, self.pyramid.encoder, self.optim.weight_decay, self.layer_decay
        )
        self.param_groups = ParamGroupPlan.from_groups(self.network, groups)

    @property
    def encoder(self) -> nn.Module:
        return self.pyramid.encoder

    def build_optimizer(self, lr: float) -> torch.optim.Optimizer:
        groups = self.param_groups.groups(self.network)
        return torch.optim.AdamW(groups, lr=lr, fused=(self.settings or self.resolve_settings()).fused_adamw)

    def architecture_record(self) -> dict[str, Any]:
        """What the checkpoint holds (not a file ``mae.load_backbone`` reads: it names this class)."""
        args = {
            "checkpoint": self.encoder_source.checkpoint,
            "model": self.encoder_source.model,
            "img_size": self.img_size,
            "in_chans": self.in_chans,
            "num_classes": self.num_classes,
        }
        return {
            "class": DENSE_CLASS,
            "args": {**args, "module": type(self).__name__, "pyramid": type(self.pyramid).__name__},
            "state_dict_prefix": f"{self.network_attribute}.",
        }

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        size = self.img_size
        checkpoint["mae_data"] = {
            "in_chans": self.in_chans,
            "img_size": [size, size] if isinstance(size, int) else list(size),
            "mean": list(self.mean),
            "std": list(self.std),
        }
