"""The joint objective for labelled small data (``mae finetune --config default_joint``, ``model.mode:
joint`` of ``mae.training.finetune.MAEFinetuneModule``): one run that trains a classifier and MAE
reconstruction together through one encoder,

    loss = (1 - w) x classification + w x MAE,   w = ``model.joint.reconstruction_weight``

(SSAT, Das et al., WACV 2024: w = 0.9, mask 0.75; it beats pretraining then fine-tuning on 10 small
datasets). The classifier reads (``model.joint.classify``):

- "full" (SSAT): a second encoder pass on the whole, unmasked image; the MAE branch reads the masked one.
  Two encoder passes per step.
- "visible" (SupMAE, Liang et al. 2022): the visible tokens of the MAE's masked pass, averaged; one
  encoder pass per step.

Validation, the EMA and every reader of the checkpoint classify the whole image.

The network (``JointMAE``) is the paper's ``MaskedAutoencoderViT``, encoder and decoder, with timm's
average-pooling classifier on its encoder: the mean of the patch tokens out of the last block (before the
final norm), ``fc_norm``, then ``head`` (``VisionTransformer(global_pool="avg")``, as ``mae finetune``
classifies). The final ``norm`` belongs to the MAE branch (the decoder reads normed tokens, as in
pretraining). Its state dict is the MAE's plus ``fc_norm.*`` and ``head.*``, one copy of every tensor,
recorded as a ``MaskedAutoencoderViT`` (``joint_record``), so the checkpoint is both:

- an MAE: ``mae.load_mae`` / ``mae reconstruct`` rebuild the model from the record and leave the
  classifier's two tensors aside;
- a classifier: ``mae.convert.classifier.classifier_of`` finds a global-average-pooling head,
  ``mae.load_backbone(..., global_pool="avg", num_classes=K)`` and ``mae export --to timm`` give timm's
  classifier (the final norm left aside), which computes exactly ``JointMAE.forward``;
- an encoder: ``mae knn``, ``mae embed`` and the monitors read the encoder through its final norm, as a
  pretraining checkpoint's.

From the fine-tuning machinery it takes layer-wise lr decay over the encoder (the embeddings lowest, then
each block; the final norm, ``fc_norm``, ``head`` and the whole decoder at the full lr), drop path in the
encoder's blocks only (both branches; timm's linear rule), label smoothing, the data module's augmentations
(the MAE branch reconstructs the augmented image), the EMA and the kNN and probe monitors. Mixup and cutmix
are refused: the MAE branch would reconstruct blended images (SSAT trains without them).
"""

from dataclasses import dataclass
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from timm.layers import DropPath, calculate_drop_path_rates, trunc_normal_
from torch import nn

from mae.convert.architecture import mae_record
from mae.convert.backbone import adapt_patch_embed
from mae.convert.checkpoint import MAECheckpoint, check_finite
from mae.convert.families import family_of
from mae.convert.report import LoadReport, load_checked
from mae.convert.sources import read_checkpoint
from mae.errors import ConfigError
from mae.models import MaskedAutoencoderViT, create_model
from mae.models.masking import sample_noise
from mae.models.targets import target_of
from mae.training.transfer import EncoderSource, check_checkpoint_exists

Classify = Literal["full", "visible"]
# The classifier's tensors in a joint checkpoint, beside the MAE's.
CLASSIFIER_TENSORS = ("fc_norm.*", "head.*")
# The model_kwargs that size a new decoder on a start file without one (and what it regresses).
NEW_DECODER_ARGS = ("decoder_embed_dim", "decoder_depth", "decoder_num_heads", "target")


@dataclass(frozen=True)
class JointSettings:
    """``model.joint``: the joint objective's settings (``model.mode: joint``); checked when built.

    Attributes:
        reconstruction_weight: w in loss = (1 - w) x classification + w x MAE, in [0, 1] (SSAT: 0.9).
        classify: what the classifier reads in training: "full" (SSAT: a second pass on the unmasked
            image) or "visible" (SupMAE: the masked pass's visible tokens).
        mask_ratio: the MAE branch's fraction of masked patches, in [0, 1) (SSAT: 0.75).
    """

    reconstruction_weight: float = 0.9
    classify: Classify = "full"
    mask_ratio: float = 0.75

    def __post_init__(self) -> None:
        if not 0.0 <= self.reconstruction_weight <= 1.0:
            raise ConfigError(
                f"model.joint.reconstruction_weight must be in [0, 1] (loss = (1 - w) x classification + w "
                f"x MAE; SSAT: 0.9), got {self.reconstruction_weight}"
            )
        if self.classify not in ("full", "visible"):
            raise ConfigError(
                f"model.joint.classify must be 'full' (SSAT: a second pass on the whole image) or 'visible' "
                f"(SupMAE: the masked pass's visible tokens), got {self.classify!r}"
            )
        if not 0.0 <= self.mask_ratio < 1.0:
            raise ConfigError(f"model.joint.mask_ratio must be in [0, 1), got {self.mask_ratio}")

    def combine(self, cls_loss: torch.Tensor, mae_loss: torch.Tensor) -> torch.Tensor:
        """The joint loss: (1 - w) x ``cls_loss`` + w x ``mae_loss``."""
        weight = self.reconstruction_weight
        return (1.0 - weight) * cls_loss + weight * mae_loss


JOINT = JointSettings()


def check_joint_mode(mode: str, joint: JointSettings, global_pool: str, mixup: float, cutmix: float) -> None:
    """Refuse, before anything is built, settings the ``mode`` cannot train with.

    Raises:
        ConfigError: ``model.joint`` set in another mode; in joint mode, a pooling other than "avg",
            or mixup / cutmix.
    """
    if mode != "joint":
        if joint != JOINT:
            raise ConfigError(
                f"model.joint sets the joint objective of model.mode joint; model.mode is {mode!r}: set "
                "model.mode joint, or leave model.joint out"
            )
        return
    if global_pool != "avg":
        raise ConfigError(
            f"model.global_pool {global_pool!r}: the joint objective classifies the mean of the patch tokens "
            "(SupMAE's visible tokens have no cls token of their own); set model.global_pool avg"
        )
    if mixup > 0 or cutmix > 0:
        raise ConfigError(
            f"model.mixup {mixup} / model.cutmix {cutmix}: the joint objective's MAE branch would "
            "reconstruct blended images (SSAT trains without them); set model.mixup 0 and model.cutmix 0"
        )


class JointMAE(MaskedAutoencoderViT):
    """The paper's masked autoencoder with a classifier on its encoder (the module's doc): ``fc_norm`` and
    ``head`` over the mean of the patch tokens out of the last block, as timm's
    ``VisionTransformer(global_pool="avg")``; drop path in the encoder's blocks.

    ``forward`` is the classifier's (what validation, the EMA and the exports compute); ``forward_joint``
    a training step's two outputs; ``reconstruction_loss`` the MAE's loss alone.

    Args:
        num_classes: the head's outputs K.
        drop_path_rate: stochastic depth of the last encoder block, 0 at the first (timm's linear rule);
            the decoder has none.
        **config: ``MaskedAutoencoderViT`` arguments of the paper's decoder (``decoder_type`` "self",
            ``decoder_keep_ratio`` 1.0).
    """

    def __init__(self, num_classes: int, drop_path_rate: float = 0.0, **config: Any) -> None:
        super().__init__(**config)
        width, eps = self.config["embed_dim"], self.config["layer_norm_eps"]
        self.fc_norm = nn.LayerNorm(width, eps=eps)
        self.head = nn.Linear(width, num_classes)
        rates = calculate_drop_path_rates(drop_path_rate, len(self.blocks))
        for block, rate in zip(self.blocks, rates, strict=True):
            if rate > 0:
                block.drop_path1, block.drop_path2 = DropPath(rate), DropPath(rate)

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's layer groups for layer-wise lr decay (``param_groups_layer_decay``): the embeddings
        lowest, then each encoder block; every other tensor (the final norm, ``fc_norm``, ``head``, the
        decoder) in the top group, at the full lr."""
        return {"stem": r"^cls_token|^pos_embed|^patch_embed", "blocks": [(r"^blocks\.(\d+)", None)]}

    def no_weight_decay(self) -> set[str]:
        """The learned tokens, without weight decay as timm's fine-tuning has them (biases and norms too:
        every 1-D tensor)."""
        return {"cls_token", "mask_token"}

    def classify(self, tokens: torch.Tensor) -> torch.Tensor:
        """(N, 1 + K, D) tokens out of the last block (before the final norm), cls first -> (N, num_classes)
        logits: the mean of the K patch tokens, ``fc_norm``, ``head``."""
        return self.head(self.fc_norm(tokens[:, 1:, :].mean(dim=1)))

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, num_classes) logits on every patch, no masking."""
        tokens = self.run_blocks(self.blocks, self.prepend_cls_token(self.embed_patches(imgs)))
        return self.classify(tokens)

    def reconstruction_loss(
        self, imgs: torch.Tensor, mask_ratio: float, noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The MAE's loss on ``imgs`` (N, C, H, W) masked at ``mask_ratio`` (``noise`` (N, L) fixes the
        masks): ``MaskedAutoencoderViT.forward``'s."""
        return super().forward(imgs, mask_ratio, noise)[0]

    def forward_joint(
        self, imgs: torch.Tensor, mask_ratio: float, classify: Classify, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A training step's (logits (N, num_classes), MAE loss) on ``imgs`` (N, C, H, W): the MAE branch on
        the patches ``noise`` (N, L) leaves visible (drawn when None) at ``mask_ratio``; the classifier on the
        whole image ("full": a second encoder pass) or on the masked pass's visible tokens ("visible")."""
        tokens, mask, ids_restore = self.visible_tokens(imgs, mask_ratio, noise)
        tokens = self.run_blocks(self.blocks, tokens)  # (N, 1 + len_keep, D), before the final norm
        pred = self.forward_decoder(self.norm(tokens), ids_restore)
        mae_loss = self.forward_loss(imgs, pred, mask)
        logits = self.classify(tokens) if classify == "visible" else self(imgs)
        return logits, mae_loss


def joint_record(network: JointMAE, prefix: str) -> dict[str, Any]:
    """The checkpoint's architecture record of ``network`` (its tensors under ``prefix``): a
    ``MaskedAutoencoderViT`` (``mae.convert.architecture.mae_record``) whose state also holds the
    classifier's ``fc_norm.*`` and ``head.*``, described under ``"classifier"``."""
    record = mae_record(network.config, prefix=prefix)
    record["classifier"] = {"global_pool": "avg", "num_classes": network.head.out_features, "head": "linear"}
    return record


def validation_noise(
    network: JointMAE, batch_size: int, mask_ratio: float, batch_idx: int, device: torch.device
) -> torch.Tensor:
    """(N, L) masking scores of validation batch ``batch_idx``: the same masks every epoch, as pretraining's
    validation draws them, so ``val/mae_loss`` compares across epochs."""
    generator = torch.Generator().manual_seed(batch_idx)
    noise = sample_noise(network.mask_strategy, batch_size, network.grid_size, mask_ratio, "cpu", generator)
    return noise.to(device)


def build_joint_network(
    source: EncoderSource,
    record: dict[str, Any] | None,
    img_size: int | tuple[int, int],
    in_chans: int,
    num_classes: int,
    drop_path_rate: float,
    head_init_std: float,
) -> tuple[JointMAE, LoadReport | None]:
    """The joint objective's network at ``img_size`` / ``in_chans`` with a ``num_classes`` head: built from
    ``record`` (a trained module's ``encoder_config``: every weight then comes from its checkpoint), else
    from ``source.checkpoint`` (read once; its weights loaded: ``load_start``; a file without a decoder
    gets a new one of the size and target ``source.model_kwargs`` give, else of its record's, else the MAE
    defaults), else fresh, of the MAE size ``source.model`` with ``source.model_kwargs``. A head the start
    does not hold is drawn with std
    ``head_init_std`` (bias 0), as fine-tuning draws it. Returns the network and the report of the load
    (None: nothing loaded), which is logged.

    Raises:
        MissingFileError: ``source.checkpoint`` does not exist.
        ConfigError: a CNN, a decoder other than the paper's, or a feature target (``joint_config``).
    """
    if record is not None:
        config = {**record, "img_size": tuple(record["img_size"])}
        return JointMAE(num_classes, drop_path_rate, **config), None
    check_checkpoint_exists(source.checkpoint)
    if source.checkpoint is None:
        with torch.device("meta"):
            sized = create_model(
                source.model, img_size=img_size, in_chans=in_chans, **(source.model_kwargs or {})
            )
        config = joint_config(sized.config, f"model.encoder.model {source.model}")
        network = JointMAE(num_classes, drop_path_rate, **config)
        loaded = None
    else:
        ckpt = read_checkpoint(source.checkpoint, source.checkpoint_format)
        config = {**ckpt.config, "img_size": img_size, "in_chans": in_chans}
        if not ckpt.has_decoder:  # the run's decoder starts new: the paper's, sized by model_kwargs if given
            decoder = {k: v for k, v in (source.model_kwargs or {}).items() if k in NEW_DECODER_ARGS}
            config.update({"decoder_type": "self", **decoder})
        network = JointMAE(num_classes, drop_path_rate, **joint_config(config, ckpt.source))
        loaded = load_start(network, ckpt)
        rank_zero_info(str(loaded))
    if loaded is None or "head.weight" in loaded.missing:  # a new head
        trunc_normal_(network.head.weight, std=head_init_std)
        nn.init.zeros_(network.head.bias)
    return network, loaded


def joint_config(config: dict[str, Any], source: str) -> dict[str, Any]:
    """``config`` (an MAE's arguments, from ``source``) as ``JointMAE`` takes it: the paper's decoder
    (``decoder_keep_ratio`` set to 1.0: partial reconstruction trains the same weights).

    Raises:
        ConfigError: naming ``source``: a CNN, the cross decoder, or the feature target (its teacher is not
            part of the run).
    """
    if family_of(config) != "vit":
        raise ConfigError(
            f"{source} is a CNN ({config.get('encoder')}); the joint objective trains a ViT MAE: give a ViT "
            "checkpoint or model.encoder.model mae_vit_*"
        )
    if config.get("decoder_type", "self") != "self":
        raise ConfigError(
            f"{source} has decoder_type {config['decoder_type']!r}; the joint objective trains the paper's "
            "decoder (decoder_type self): give a checkpoint of it, or one without a decoder"
        )
    if target_of(config) == "features":
        raise ConfigError(
            f"{source} regresses a teacher's features (target features); the joint objective reconstructs "
            "the image (target norm_pix, pixel or hog)"
        )
    return {**config, "decoder_keep_ratio": 1.0, "decoder_encoder_layers": None}


def load_start(network: JointMAE, ckpt: MAECheckpoint) -> LoadReport:
    """Load the start ``ckpt`` (a ViT's, read: a pretraining, joint, fine-tuned or encoder-only file) into
    ``network``, built with its architecture: every tensor that fits, the report noting each part that
    starts new. The fixed sin-cos position embeddings stay the network's (its grid); input channels are
    adapted (``adapt_patch_embed``). A file without a decoder starts a new one (``build_joint_network``
    sizes it); without a final norm (a classifier fine-tuned with average pooling) a new norm;
    a head of another class count, or a linear probe's, a new head.

    Raises:
        InputError: NaN or infinite weights, or tensors that do not fit (``load_checked``), naming the file.
    """
    report = LoadReport(ckpt.source, ckpt.format, notes=list(ckpt.notes), config=network.config)
    check_finite(ckpt.state_dict, ckpt.source)
    state = adapt_patch_embed(dict(ckpt.state_dict), network.config["in_chans"], report)
    state = {k: v for k, v in state.items() if k not in ("pos_embed", "decoder_pos_embed")}
    report.notes.append(f"fixed sin-cos position embeddings are those of the {network.grid_size} grid")
    allowed = ["pos_embed", "decoder_pos_embed", *CLASSIFIER_TENSORS]
    own = network.state_dict()
    if not ckpt.has_decoder:
        allowed += ["decoder_*", "mask_token"]
        depth, width, target = (network.config[k] for k in ("decoder_depth", "decoder_embed_dim", "target"))
        report.notes.append(
            f"the file has no decoder: a new one ({depth} blocks, {width} wide, target {target}) starts from "
            "its initialisation"
        )
    elif state["decoder_pred.weight"].shape != own["decoder_pred.weight"].shape:
        state = {k: v for k, v in state.items() if not k.startswith("decoder_pred.")}
        allowed.append("decoder_pred.*")
        report.notes.append("decoder_pred (another channel count) starts from its initialisation")
    if "norm.weight" not in state:
        allowed.append("norm.*")
        report.notes.append(
            "the file has no final norm (a classifier fine-tuned with average pooling): the MAE's starts new"
        )
    head = [k for k in state if k.startswith("head.")]
    if any(k not in own or state[k].shape != own[k].shape for k in head):
        state = {k: v for k, v in state.items() if k not in head}
        report.notes.append("the file's head (another class count, or a linear probe's) is not loaded")
    return load_checked(network, state, report, allowed_missing=allowed)
