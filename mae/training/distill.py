"""The distillation ``LightningModule`` (``mae distill``): TinyMIM's relation distillation of a frozen teacher
into a plain timm ViT student.

Each training step the teacher (``mae.training.teacher.load_teacher``: any encoder ``mae.load_backbone``
reads, frozen, in eval mode, under ``no_grad``, on the student's device, never part of this module's state)
and the student see the same whole, unmasked images; the student learns the teacher's relations of one
block (``mae.models.relations``: softmax(Q Kᵀ/√d) and softmax(V Vᵀ/√d) per head, the teacher's head count,
KL divergence). The optimiser and its schedule are pretraining's (AdamW with weight decay on weights only,
lr = base_lr x effective batch / 256, per-step warmup + half-cycle cosine: ``mae.training.base``).

The student's checkpoints record it as a timm ``VisionTransformer`` (``mae.convert.architecture``'s record,
its tensors under ``student.``), so ``mae.load_backbone``, ``mae finetune --model.encoder.checkpoint`` and
``mae export`` read them as they read a fine-tuned encoder. The teacher's identity (path, sha256, format and
shape) is in the hyperparameters (``teacher_identity``), so in every checkpoint and the run's
``hparams.yaml``; a resumed run refuses a teacher whose weights changed.

References: TinyMIM (Ren et al., CVPR 2023) and its public implementation (OliverRensu/TinyMIM).
"""

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from timm.models.vision_transformer import VisionTransformer
from torch.nn import functional as F
from torchmetrics import MeanMetric

from mae.convert.architecture import encoder_config, vit_record
from mae.convert.backbone import build_vit
from mae.errors import ConfigError
from mae.models.relations import Relations, block_index, block_relations, check_relation_heads, relation_loss
from mae.models.student import create_student
from mae.training.base import MAETrainingModule
from mae.training.optim import ParamGroupPlan, weight_decay_groups
from mae.training.pretrain import model_input
from mae.training.settings import (
    AUTO_KERNELS,
    KernelChoices,
    PretrainOptimSettings,
    TeacherSettings,
    as_group,
)
from mae.training.sharding import FSDP2Strategy
from mae.training.teacher import TeacherIdentity, check_same_teacher, load_teacher

# TinyMIM's pretraining optimiser (OliverRensu/TinyMIM README): AdamW (0.9, 0.95), base lr 1.5e-4 per 256
# images, weight decay 0.05, 15 warmup epochs (of 300), cosine to 0.
DISTILL_OPTIM = PretrainOptimSettings(warmup_epochs=15.0)
# Relations are distributions already: no normalisation of the teacher's tokens (feature targets' option).
DISTILL_TEACHER = TeacherSettings(normalize=False)
STUDENT_PREFIX = "student."  # where the student's tensors sit in a checkpoint's state dict


def student_record(student: VisionTransformer) -> dict[str, Any]:
    """The checkpoint record (``mae.convert.architecture.vit_record``) of ``student``, checked to rebuild
    it: the model ``load_backbone`` builds from the record has exactly its tensors.

    Raises:
        ConfigError: a student the record cannot describe (non-square patches, extra or missing tensors
            such as register tokens, LayerScale or qk-norm), naming ``model.student`` and the tensors.
    """
    patch = tuple(student.patch_embed.patch_size)
    if patch[0] != patch[1]:
        raise ConfigError(f"model.student has {patch[0]}x{patch[1]}-px patches: the student's must be square")
    args = dict(
        img_size=list(student.patch_embed.img_size),
        patch_size=patch[0],
        in_chans=student.patch_embed.proj.in_channels,
        embed_dim=student.embed_dim,
        depth=len(student.blocks),
        num_heads=student.blocks[0].attn.num_heads,
        mlp_ratio=student.blocks[0].mlp.fc1.out_features / student.embed_dim,
        qkv_bias=True,
        class_token=True,
        global_pool="token",
        num_classes=0,
    )
    record = vit_record(args, getattr(student.norm, "eps", 1e-6), prefix=STUDENT_PREFIX)
    with torch.device("meta"):
        rebuilt = build_vit(encoder_config(record, "model.student"))
    ours = {k: tuple(v.shape) for k, v in student.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in rebuilt.state_dict().items()}
    if ours != theirs:
        differ = sorted({name for name, _ in set(ours.items()) ^ set(theirs.items())})
        raise ConfigError(
            f"model.student is not a plain ViT that mae's checkpoints record (class token, qkv bias, "
            f"LayerNorm, no register tokens, LayerScale or qk-norm): its tensors differ at "
            f"{differ[:4]}; choose a vit_tiny / vit_small / vit_base student"
        )
    return record


def teacher_img_size(student: VisionTransformer, teacher_patch: int) -> tuple[int, int]:
    """The input size (H, W) at which a teacher with ``teacher_patch`` px patches has the student's patch
    grid, so that both see the same pixels as the same tokens.

    Raises:
        ConfigError: the student's images are not a whole number of its patches, so no teacher grid
            covers the same pixels, naming both grids.
    """
    (height, width), (patch, _) = student.patch_embed.img_size, student.patch_embed.patch_size
    grid = tuple(student.patch_embed.grid_size)
    if height % patch or width % patch:
        raise ConfigError(
            f"data.img_size {height}x{width} is not a whole number of the student's {patch}-px patches: its "
            f"{grid[0]}x{grid[1]} patch grid leaves pixels out, and the teacher's {teacher_patch}-px patches "
            f"would see them on a {height // teacher_patch}x{width // teacher_patch} grid; the two grids "
            f"cannot map token to token: choose data.img_size a multiple of {patch}"
        )
    return grid[0] * teacher_patch, grid[1] * teacher_patch


def freeze_after_relations(student: VisionTransformer, block: int) -> list[str]:
    """Set ``requires_grad`` False on what the relations of ``student.blocks[block]`` do not depend on (the
    rest of that block after ``qkv``, the blocks after it, the final norms), and return their names: they
    get no gradient, as in TinyMIM, and would stall DDP. They stay as initialised in the checkpoint
    (fine-tuning trains them)."""
    after = ("blocks.", "norm.", "fc_norm.", "head.")
    used = {id(p) for name, p in student.named_parameters() if not name.startswith(after)}
    for earlier in student.blocks[:block]:
        used |= {id(p) for p in earlier.parameters()}
    chosen = student.blocks[block]
    for part in (chosen.norm1, chosen.attn.qkv, chosen.attn.q_norm, chosen.attn.k_norm):
        used |= {id(p) for p in part.parameters()}
    frozen = [name for name, p in student.named_parameters() if id(p) not in used and p.requires_grad]
    for p in student.parameters():
        if id(p) not in used:
            p.requires_grad_(False)
    return frozen


class MAEDistillModule(MAETrainingModule):
    """TinyMIM relation distillation of a frozen teacher into a timm ViT student.

    Args:
        teacher: the frozen teacher (``mae.training.settings.TeacherSettings``): ``checkpoint`` (required:
            any encoder ``mae.load_backbone`` reads), its ``format``, and ``block``, whose relations are the
            targets (-1, the last, as TinyMIM for a ViT-B teacher); ``normalize`` must stay false.
        student: a timm ViT name, e.g. "vit_tiny_patch16_224", "vit_small_patch16_224".
        student_kwargs: timm arguments over the student's architecture (``patch_size``, ``embed_dim``,
            ``depth``, ``num_heads``, ...).
        img_size: input size; linked from ``data.img_size`` by the CLI. The teacher sees the same images,
            resized when its patches differ so that its grid is the student's (``teacher_img_size``).
        in_chans: image channels; linked from ``data.in_chans`` (a teacher trained on other channels is
            adapted as ``load_backbone`` does).
        student_block: the student block whose relations learn the teacher's (-1, the last, as TinyMIM).
        drop_path_rate: the student's stochastic depth (TinyMIM: 0.1).
        optim: the optimiser and schedule (``PretrainOptimSettings``; TinyMIM's: base_lr 1.5e-4 per 256
            images, min_lr 0, warmup_epochs 15, weight_decay 0.05, betas (0.9, 0.95)).
        kernels: the kernel choices (``KernelChoices``), as for pretraining.
        teacher_identity: leave it None: filled in when the teacher is read (``TeacherIdentity.record()``)
            and recorded in the checkpoints; when set (a checkpoint rebuilt by ``load_from_checkpoint``),
            the teacher read must have its sha256.
    """

    network_attribute = "student"

    def __init__(
        self,
        teacher: TeacherSettings = DISTILL_TEACHER,
        student: str = "vit_tiny_patch16_224",
        student_kwargs: dict[str, Any] | None = None,
        img_size: int | tuple[int, int] = 224,
        in_chans: int = 3,
        student_block: int = -1,
        drop_path_rate: float = 0.1,
        optim: PretrainOptimSettings = DISTILL_OPTIM,
        kernels: KernelChoices = AUTO_KERNELS,
        teacher_identity: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(as_group(optim, DISTILL_OPTIM), as_group(kernels, AUTO_KERNELS))
        self.teacher_settings = as_group(teacher, DISTILL_TEACHER)
        self.save_settings(teacher=self.teacher_settings)
        self._check_teacher_settings()
        self.student = create_student(student, img_size, in_chans, drop_path_rate, **(student_kwargs or {}))
        teacher_vit, self.identity = self._read_teacher(in_chans)
        self.__dict__["_teacher"] = (
            teacher_vit  # a plain attribute, not a submodule (nn.Module registers those)
        )
        self.student_architecture = student_record(self.student)
        self.student_block = block_index(self.student, student_block, "model.student_block")
        if teacher_identity is not None:
            check_same_teacher(teacher_identity, self.identity)
        self.teacher_identity = self.hparams.teacher_identity = self.identity.record()
        self.teacher_block = block_index(self._teacher, self.teacher_settings.block, "model.teacher.block")
        self.heads = self.identity.num_heads
        check_relation_heads(self.student.embed_dim, self.heads, f"model.student {student}")
        self.frozen = freeze_after_relations(self.student, self.student_block)
        # Decay on weights only, fixed by name now: a strategy may flatten parameters before the optimizer.
        groups = weight_decay_groups(self.student, self.optim.weight_decay)
        self.param_groups = ParamGroupPlan.from_groups(self.student, groups)
        self.val_loss = MeanMetric()
        rank_zero_info(
            f"model.teacher: {self.identity.described()}; relations of its block {self.teacher_block} "
            f"({self.heads} heads) into the student's block {self.student_block}"
        )

    def _check_teacher_settings(self) -> None:
        """Refuse a run without a teacher, or with normalised teacher tokens (a feature-target option)."""
        if self.teacher_settings.checkpoint is None:
            raise ConfigError(
                "model.teacher.checkpoint is not set: mae distill needs the teacher to distil, any encoder "
                "mae.load_backbone reads (for the default recipe, run `mae pretrain --config default` first)"
            )
        if self.teacher_settings.normalize:
            raise ConfigError(
                "model.teacher.normalize is true, but mae distill distils the teacher's attention relations, "
                "which are distributions, not its tokens: set model.teacher.normalize to false"
            )

    def _read_teacher(self, in_chans: int) -> tuple[VisionTransformer, TeacherIdentity]:
        """The frozen teacher at the size that gives it the student's patch grid, and its identity; a plain
        attribute, not a submodule: never in the state dict, the optimizer, DDP or FSDP2."""
        teacher, identity = load_teacher(
            self.teacher_settings.checkpoint, self.teacher_settings.format, in_chans=in_chans
        )
        size = teacher_img_size(self.student, identity.patch_size)
        if tuple(teacher.patch_embed.img_size) != size:
            teacher.set_input_size(img_size=size)  # its position embeddings resampled once for this grid
        return teacher, identity

    def setup(self, stage: str) -> None:
        if isinstance(self.trainer.strategy, FSDP2Strategy):
            raise ConfigError(
                "mae distill cannot train under FSDP2 (trainer.strategy FSDP2Strategy): its loss reads the "
                "student's queries and keys inside a block, whose sharded weights FSDP2 frees before the "
                "backward needs them; use trainer.strategy ddp (a ViT-S or ViT-T student fits on one device)"
            )
        super().setup(stage)

    @property
    def teacher(self) -> VisionTransformer:
        """The frozen teacher (not a submodule of this module)."""
        return self._teacher

    def _teacher_relations(self, imgs: torch.Tensor) -> Relations:
        """The teacher's relations of (N, C, H, W) ``imgs``, on their device, resized to its grid's size."""
        weight = next(self._teacher.parameters())
        if weight.device != imgs.device:
            self._teacher.to(imgs.device)
        size = tuple(self._teacher.patch_embed.img_size)
        if tuple(imgs.shape[-2:]) != size:
            imgs = F.interpolate(imgs, size=size, mode="bicubic", align_corners=False, antialias=True)
        with torch.no_grad():
            return block_relations(self._teacher, imgs.to(weight.dtype), self.teacher_block, self.heads)

    def distillation_loss(self, imgs: torch.Tensor) -> torch.Tensor:
        """TinyMIM's loss on (N, C, H, W) normalised images: the KL divergences of the student's relations
        from the teacher's (``mae.models.relations.relation_loss``)."""
        target = self._teacher_relations(imgs)
        return relation_loss(block_relations(self.student, imgs, self.student_block, self.heads), target)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        imgs = model_input(batch)
        loss = self.distillation_loss(imgs)
        self.log_training_loss(loss.total, imgs.shape[0])
        if not self.replaying:
            parts = {"train/loss_qk": loss.qk, "train/loss_vv": loss.vv}
            self.log_dict(parts, on_step=True, on_epoch=True, batch_size=imgs.shape[0])
        return loss.total

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        imgs = model_input(batch)
        self.val_loss.update(self.distillation_loss(imgs).total, weight=imgs.shape[0])
        self.log("val/loss", self.val_loss, prog_bar=True)

    def architecture_record(self) -> dict[str, Any]:
        return self.student_architecture

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # A resumed run (--ckpt_path) goes on only with the teacher it was trained with.
        recorded = (checkpoint.get("hyper_parameters") or {}).get("teacher_identity")
        if recorded is not None:
            check_same_teacher(recorded, self.identity)

    def build_optimizer(self, lr: float) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            self.param_groups.groups(self.student),
            lr=lr,
            betas=self.optim.betas,
            fused=(self.settings or self.resolve_settings()).fused_adamw,
        )
