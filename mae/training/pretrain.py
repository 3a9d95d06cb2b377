"""The pretraining ``LightningModule``: a thin wrapper that trains ``MaskedAutoencoderViT``."""

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn
from torchmetrics import MeanMetric

from mae.convert.architecture import ARCHITECTURE_KEY, mae_record
from mae.convert.backbone import init_mae_from
from mae.errors import ConfigError, MissingFileError
from mae.models import MaskedAutoencoderViT, create_model
from mae.models.decoder_switches import DecoderType
from mae.models.flops import mae_train_flops
from mae.models.masking import MaskStrategy, sample_noise
from mae.training.base import MAETrainingModule
from mae.training.optim import (
    PRETRAIN_OPTIMIZERS,
    ParamGroupPlan,
    encoder_decoder_groups,
    per_device_batch_size,
    weight_decay_groups,
)
from mae.training.resolution import ResolutionSchedule, resize_batch
from mae.training.runtime import TrainingSettings
from mae.training.settings import (
    AUTO_KERNELS,
    NO_TEACHER,
    PRETRAIN_OPTIM,
    KernelChoices,
    PretrainOptimSettings,
    TeacherSettings,
    as_group,
)
from mae.training.sharding import is_sharded
from mae.training.teacher import TeacherIdentity, check_same_teacher, check_teacher_settings, load_teacher


def sized_mae(name: str, model_kwargs: dict[str, Any] | None, **own: Any) -> MaskedAutoencoderViT:
    """The MAE ``name`` with the module's ``own`` arguments (img_size, in_chans, the masking and decoder
    switches) and the ``model_kwargs`` overrides of the rest of its architecture (depth, ...).

    Raises:
        ConfigError: ``model_kwargs`` sets one of the module's own arguments, naming the key to set instead.
    """
    model_kwargs = dict(model_kwargs or {})
    clash = [key for key in own if key in model_kwargs]
    if clash:
        raise ConfigError(
            f"model.model_kwargs sets {clash}; set model.{clash[0]} (img_size: data.img_size) instead"
        )
    return create_model(name, **own, **model_kwargs)


def model_input(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """A batch's images, normalised by its data module (``mae.data.ImageDataModule.normalize``, the
    one place that normalises).

    Raises:
        TypeError: uint8 images, which a data module that does not normalise passed on.
    """
    imgs = batch[0]
    if imgs.dtype == torch.uint8:
        raise TypeError(
            "pretraining takes normalised float images, got a uint8 batch: a data module derived from "
            "mae.data.ImageDataModule normalises on the device; another must normalise its batches itself"
        )
    return imgs


class MAEPretrainModule(MAETrainingModule):
    """MAE pretraining with the paper's optimiser and schedule.

    Args:
        model: factory name, e.g. "mae_vit_base_patch16" (see ``mae.models.MODEL_REGISTRY``).
        img_size: input size; linked from ``data.img_size`` by the CLI.
        model_kwargs: overrides of ``MaskedAutoencoderViT`` arguments (e.g. depth, decoder_depth).
        mask_ratio: fraction of patches removed, in [0, 1).
        mask_strategy: "random" (paper default), "block" or "grid".
        decoder_type: "self" (the paper) or "cross" (CrossMAE: mask-token queries cross-attend to the
            visible tokens); see ``MaskedAutoencoderViT``.
        decoder_keep_ratio: fraction of the masked patches reconstructed (and in the loss) per training
            step, in (0, 1]; 1.0 = the paper. Validation reconstructs every masked patch.
        decoder_encoder_layers: cross decoder only: the encoder layer each decoder block reads (one per
            decoder block, the last among them); null = the encoder's output.
        target: what the decoder regresses for each patch (``mae.models.targets.TARGETS``): "norm_pix" (the
            pixels normalised per patch, as the paper's released models; until 0.4.0
            ``norm_pix_loss: true``), "pixel" (the plain pixels; ``norm_pix_loss: false``) or "hog"
            (MaskFeat's histograms of oriented gradients, 2 x 2 cells x C x 9 bins per patch) or "features"
            (the tokens of the frozen teacher ``teacher`` names, D_teacher per patch).
        teacher: ``model.teacher`` (``mae.training.settings.TeacherSettings``): the frozen encoder of target
            "features" (its checkpoint, format, block and whether its tokens are normalised); refused with
            any other target. Read when the module is built; its identity (path, sha256, widths) goes into
            the hyperparameters (``teacher_identity``), every checkpoint's architecture record and the model
            card; a resumed run refuses a teacher of another sha256. Never part of the checkpoint.
        optim: the optimiser and its schedule (``mae.training.settings.PretrainOptimSettings``, the paper's:
            base_lr 1.5e-4 per 256 images, min_lr 0, warmup_epochs 40, weight_decay 0.05, AdamW betas
            (0.9, 0.95)).
        kernels: the kernel choices (``mae.training.settings.KernelChoices``), each "auto" by default:
            the attention kernel and the fused AdamW as measured for the training device and precision,
            ``torch.compile`` for runs of at least ``mae.training.runtime.COMPILE_MIN_STEPS`` optimizer
            steps, which repay the compilation time.
        in_chans: image channels; linked from ``data.in_chans`` by the CLI.
        init_from: start from these pretrained weights (any format ``mae.load_mae`` reads; see
            ``mae.convert.backbone.init_mae_from``): a new run, with a new optimizer and schedule. Read when
            the module is built: ``load_from_checkpoint`` of such a run's checkpoint without the file takes
            ``init_from=None`` (the checkpoint holds every weight).
        init_format: "auto" or the format of ``init_from``.
        freeze_encoder_epochs: train only the decoder for this many first epochs (the encoder's lr is
            0; its gradients are still computed, so multi-GPU runs stay in step): a fresh decoder on a
            pretrained encoder.
        resolution_schedule: progressive resolution (``mae.training.resolution``): ``[[start, size], ...]``,
            ``start`` a fraction of ``trainer.max_epochs``, the last size ``data.img_size``; e.g.
            ``[[0, 16], [0.8, 32]]``. Each training batch is resized (antialiased) to its epoch's size and
            the position embeddings are recomputed for that grid; the mask ratio, batch size and lr stay;
            validation, the monitors and every checkpoint see the final size. None: one size throughout.
        grad_checkpointing: activation checkpointing of every encoder and decoder block
            (``MaskedAutoencoderViT.set_grad_checkpointing``): far less activation memory for about a third
            more step time; the same losses and gradients.
    """

    network_attribute = "model"

    def __init__(
        self,
        model: str = "mae_vit_base_patch16",
        img_size: int | tuple[int, int] = 224,
        model_kwargs: dict[str, Any] | None = None,
        mask_ratio: float = 0.75,
        mask_strategy: MaskStrategy = "random",
        decoder_type: DecoderType = "self",
        decoder_keep_ratio: float = 1.0,
        decoder_encoder_layers: list[int] | None = None,
        target: str = "norm_pix",
        teacher: TeacherSettings = NO_TEACHER,
        optim: PretrainOptimSettings = PRETRAIN_OPTIM,
        kernels: KernelChoices = AUTO_KERNELS,
        in_chans: int = 3,
        init_from: str | None = None,
        init_format: str = "auto",
        freeze_encoder_epochs: int = 0,
        resolution_schedule: list[list] | None = None,
        grad_checkpointing: bool = False,
    ) -> None:
        super().__init__(as_group(optim, PRETRAIN_OPTIM), as_group(kernels, AUTO_KERNELS))
        teacher = as_group(teacher, NO_TEACHER)
        self.save_settings(teacher=teacher)
        if freeze_encoder_epochs < 0:
            raise ConfigError(f"model.freeze_encoder_epochs must be >= 0, got {freeze_encoder_epochs}")
        check_teacher_settings(target, teacher)
        own = dict(
            img_size=img_size,
            in_chans=in_chans,
            target=target,
            mask_strategy=mask_strategy,
            decoder_type=decoder_type,
            decoder_keep_ratio=decoder_keep_ratio,
            decoder_encoder_layers=decoder_encoder_layers,
        )
        self.teacher_identity: TeacherIdentity | None = None
        if teacher.checkpoint is None:
            self.model = sized_mae(model, model_kwargs, **own)
        else:
            self.model = self._student_of(teacher, model, model_kwargs, own)
        self.model.set_grad_checkpointing(grad_checkpointing)
        self.model.check_mask_ratio(mask_ratio)  # at start-up, once: training steps pass it unchanged
        self.model.check_decoded_patches(mask_ratio)
        self.resolution = None
        if resolution_schedule is not None:
            self.resolution = ResolutionSchedule.parse(
                resolution_schedule,
                img_size,
                self.model.patch_size,
                check=lambda size: self._check_trainable_at(size, mask_ratio),
            )
        # This run's phases as trained: (size (H, W), first 0-based optimizer step), for the run summary.
        self.resolution_run: list[tuple[tuple[int, int], int]] = []
        self.resolution_last_epoch = 0  # the last epoch this run started
        self.init_report = None if init_from is None else self._start_from(init_from, init_format)
        # Decay on weights only, fixed by name now: a strategy may flatten parameters before the optimizer.
        groups = weight_decay_groups(self.model, self.optim.weight_decay)
        if freeze_encoder_epochs:
            groups = encoder_decoder_groups(self.model, groups)
        self.param_groups = ParamGroupPlan.from_groups(self.model, groups)
        self.mask_ratio = mask_ratio
        self.init_from = init_from
        self.freeze_encoder_epochs = freeze_encoder_epochs
        self.epoch_losses: list[float] = []  # mean training loss of each epoch, for the run summary
        self.val_loss = MeanMetric()

    def _student_of(
        self, teacher: TeacherSettings, name: str, model_kwargs: dict[str, Any] | None, own: dict[str, Any]
    ) -> MaskedAutoencoderViT:
        """The MAE ``name`` regressing the tokens of ``teacher``: the teacher read (on the student's patch
        grid), the student sized by its width, the teacher handed to its target and checked there (block,
        grid), its identity recorded."""
        with torch.device("meta"):  # the student's patch grid, before the teacher is read
            grid = sized_mae(name, model_kwargs, **{**own, "target": "pixel"}).grid_size
        network, identity = load_teacher(
            teacher.checkpoint, teacher.format, grid_size=grid, in_chans=own["in_chans"]
        )
        rank_zero_info(f"model.teacher: {identity.described()}; block {teacher.block}")
        options = dict(dim=identity.embed_dim, block=teacher.block, normalize=teacher.normalize)
        student = sized_mae(
            name, model_kwargs, **own, target_options={**options, "teacher": identity.record()}
        )
        student.target.set_teacher(network, student.grid_size)
        self.teacher_identity = identity
        self.save_hyperparameters({**self.hparams, "teacher_identity": identity.record()})
        return student

    def _start_from(self, init_from: str, init_format: str) -> Any:
        """Load the pretrained weights ``init_from`` into ``self.model`` (``init_mae_from``); its report.

        Raises:
            MissingFileError: naming ``model.init_from`` and how to load a trained checkpoint without it.
        """
        if not Path(init_from).exists():
            raise MissingFileError(
                f"model.init_from {init_from} does not exist (to load a trained checkpoint of a run that "
                "started from it, pass init_from=None: the checkpoint holds every weight)"
            )
        report = init_mae_from(self.model, init_from, init_format)
        rank_zero_info(f"model.init_from: {report}")
        return report

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.check_trainer(self.trainer)
            if self.resolution is not None and (self.trainer.max_epochs or -1) < 1:
                raise ConfigError(
                    f"model.resolution_schedule starts its phases at fractions of trainer.max_epochs, which "
                    f"is {self.trainer.max_epochs}: set trainer.max_epochs to the run's length in epochs"
                )
            if self.resolution is not None:
                self.resolution.check_epochs(self.trainer.max_epochs)
            self._count_flops()
        super().setup(stage)  # loads the training data (the run's length in steps)
        if stage == "fit" and self.resolution is not None:
            batches = self.trainer.num_training_batches
            if math.isfinite(batches):
                self.resolution.check_run_length(
                    self.trainer.max_epochs,
                    math.ceil(batches / self.trainer.accumulate_grad_batches),
                    self.trainer.max_steps,
                )

    def _count_flops(self) -> None:
        self.flops_per_batch = mae_train_flops(
            self.model, per_device_batch_size(self.trainer), self.mask_ratio
        )

    # ------------------------------------------------------------------ progressive resolution
    @property
    def img_size(self) -> tuple[int, int]:
        """The input size (H, W) in pixels the model takes now: the current phase's of
        ``model.resolution_schedule``, else the size it was built at."""
        return (
            self.model.grid_size[0] * self.model.patch_size,
            self.model.grid_size[1] * self.model.patch_size,
        )

    def _check_trainable_at(self, size: tuple[int, int], mask_ratio: float) -> None:
        """Raise ``ConfigError`` when the model cannot train on (H, W) ``size`` inputs at ``mask_ratio``:
        a patch grid its strategy cannot mask, or one the ratio leaves no visible or decoded patch of."""
        with self.at_img_size(size):
            self.model.check_mask_ratio(mask_ratio)
            self.model.check_decoded_patches(mask_ratio)
            self.model.target.check_grid(self.model.grid_size)

    @property
    def resolution_summary(self) -> str | None:
        """This run's phases of ``model.resolution_schedule`` as trained, e.g. ``16x16 px (steps 0-99),
        32x32 px (steps 100-199)`` (0-based optimizer steps); None without a schedule or a step."""
        if not self.resolution_run:
            return None
        ends = [step for _, step in self.resolution_run[1:]] + [self.global_step]
        shown = [
            f"{size[0]}x{size[1]} px ({f'step {first}' if end - first == 1 else f'steps {first}-{end - 1}'})"
            for (size, first), end in zip(self.resolution_run, ends, strict=True)
            if end > first
        ]
        return ", ".join(shown) or None

    @contextmanager
    def at_img_size(self, size: tuple[int, int] | None = None) -> Iterator[None]:
        """Inside the block, the model takes inputs of ``size`` (default: the built, final size); after it,
        the size it had before."""
        before = self.img_size
        self.model.set_img_size(size if size is not None else self.model.config["img_size"])
        try:
            yield
        finally:
            self.model.set_img_size(before)

    def on_train_epoch_start(self) -> None:
        if self.resolution is not None:
            size = self.resolution.size_at(self.current_epoch, self.trainer.max_epochs)
            if size != self.img_size:
                rank_zero_info(
                    f"model.resolution_schedule: epoch {self.current_epoch + 1} on, {size[0]}x{size[1]} "
                    "inputs"
                )
                self.model.set_img_size(size)
                self._count_flops()
            if not self.resolution_run or self.resolution_run[-1][0] != size:
                self.resolution_run.append((size, self.global_step))
            self.resolution_last_epoch = self.current_epoch

    def on_train_end(self) -> None:
        if self.resolution is None or not self.resolution_run:
            return
        # A time limit or an early stop ends a run before the epochs its phases start at: its checkpoints
        # then hold the final-size model, never trained at that size (a max_steps cap is refused in setup).
        max_epochs = self.trainer.max_epochs
        phase = self.resolution.next_phase(self.resolution_last_epoch, max_epochs)
        if phase is None:
            return
        final = self.resolution.phases[-1][1]
        sizes = ", ".join(dict.fromkeys(f"{size[0]}x{size[1]}" for size, _ in self.resolution_run))
        rank_zero_warn(
            f"model.resolution_schedule: the run stopped at step {self.global_step} before its phase "
            f"{self.resolution.shown(phase)} (epoch {self.resolution.first_epoch(phase, max_epochs) + 1} on) "
            f"started: this run trained only at {sizes} px, yet its checkpoints hold the "
            f"{final[0]}x{final[1]} model; resume from its last checkpoint (--ckpt_path) to train the "
            "remaining phases"
        )

    def on_validation_start(self) -> None:
        self._training_size = self.img_size  # validation and the monitors see the final size
        self.model.set_img_size(self.model.config["img_size"])

    def on_validation_end(self) -> None:
        self.model.set_img_size(self._training_size)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        # The checkpoint holds the final size's position embeddings, whatever phase it is saved in, so
        # that it loads into the model its architecture record describes.
        with self.at_img_size():
            for name in ("pos_embed", "decoder_pos_embed"):  # the ViT's; a CNN has none
                if hasattr(self.model, name):
                    checkpoint["state_dict"][f"model.{name}"] = getattr(self.model, name).detach().clone()

    def architecture_record(self) -> dict[str, Any]:
        return mae_record(self.model.config, prefix="model.")

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # A resumed run goes on with the teacher it started with, or not at all.
        super().on_load_checkpoint(checkpoint)
        args = (checkpoint.get(ARCHITECTURE_KEY) or {}).get("args") or {}
        recorded = (args.get("target_options") or {}).get("teacher")
        if self.teacher_identity is not None and recorded:
            check_same_teacher(recorded, self.teacher_identity)

    def on_fit_start(self) -> None:
        super().on_fit_start()
        if self.init_report is None:
            return
        folder = Path(self.trainer.log_dir or self.trainer.default_root_dir)  # on every rank: a collective
        if self.trainer.is_global_zero:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "init_from.txt").write_text(f"{self.init_from}\n{self.init_report}\n")

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if not self.freeze_encoder_epochs:
            return
        frozen = self.current_epoch < self.freeze_encoder_epochs
        for group in self.trainer.optimizers[0].param_groups:
            if group.get("encoder"):
                group["lr_scale"] = 0.0 if frozen else 1.0
        self.lr_schedulers().step_update(num_updates=self.global_step)  # this step's lr with those scales

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        imgs = resize_batch(model_input(batch), self.img_size)  # a phase of model.resolution_schedule
        loss, _, _ = self.model(imgs, self.mask_ratio)
        self.log_training_loss(loss, imgs.shape[0])
        return loss

    def on_train_epoch_end(self) -> None:
        loss = self.trainer.callback_metrics.get("train/loss_epoch")
        if loss is not None:
            self.epoch_losses.append(float(loss))

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        imgs = model_input(batch)
        # The same masks every epoch, so validation losses are comparable across epochs.
        generator = torch.Generator().manual_seed(batch_idx)
        model = self.model  # its strategy and this ratio were checked at build
        noise = sample_noise(
            model.mask_strategy, imgs.shape[0], model.grid_size, self.mask_ratio, "cpu", generator
        )
        noise = noise.to(imgs.device)
        loss, _, _ = self.model(imgs, self.mask_ratio, noise)
        self.val_loss.update(loss, weight=imgs.shape[0])  # reduced exactly across processes
        self.log("val/loss", self.val_loss, prog_bar=True)

    def build_optimizer(self, lr: float) -> torch.optim.Optimizer:
        return PRETRAIN_OPTIMIZERS[self.optim.optimizer](
            self.param_groups.groups(self.model),
            lr,
            self.optim.betas,
            (self.settings or self.resolve_settings()).fused_adamw,
        )

    # ------------------------------------------------------------------ the CNN family
    @property
    def is_cnn(self) -> bool:
        """Whether the model is a CNN (``mae.models.cnn.MaskedAutoencoderCNN``), not a ViT."""
        return getattr(self.model, "family", "vit") == "cnn"

    @property
    def encoder(self) -> nn.Module:
        """What the monitors evaluate: the MAE (ViT), or a CNN's encoder, the plain timm model (outside the
        MAE's own forward no mask is set: ``mae.models.cnn.sparse.MaskContext.masking``)."""
        return self.model.encoder if self.is_cnn else self.model

    def check_trainer(self, trainer: pl.Trainer) -> None:
        """Refuse, before any work, the trainer settings a CNN model cannot train under.

        Raises:
            ConfigError: ``trainer.sync_batchnorm`` (Lightning would swap the sparse BatchNorms for
                torch's SyncBatchNorm, which normalises over masked positions too), FSDP2 (naming the
                strategy and DDP instead), ``model.kernels.compile: true``.
        """
        if not self.is_cnn:
            return
        self._refuse_compile()
        name = self.model.config["encoder"]
        if getattr(trainer._accelerator_connector, "_layer_sync", None) is not None:
            raise ConfigError(
                f"trainer.sync_batchnorm: true would replace the CNN {name}'s sparse BatchNorms (statistics "
                "over visible positions only) by torch's SyncBatchNorm, over masked positions too: set "
                "trainer.sync_batchnorm: false (each process then normalises over its own batch, as SparK "
                "pretrains)"
            )
        if is_sharded(trainer):
            raise ConfigError(
                f"trainer.strategy {type(trainer.strategy).__name__} (FSDP2) shards a ViT's blocks; a CNN "
                f"model ({name}) trains under trainer.strategy: ddp: its timm encoder runs through "
                "forward_intermediates and, in the monitors and exports, on its own, where FSDP2's "
                "per-module gathering does not reach, and it fits one device (ResNet-50 25M, "
                "ConvNeXt-V2-B 89M parameters)"
            )

    def resolve_settings(self, steps: float | None = None) -> TrainingSettings:
        """As ``MAETrainingModule.resolve_settings``; for a CNN model, ``kernels.compile: auto`` is off
        and ``true`` refused: its sparse BatchNorm gathers the visible positions (a shape that depends on
        the mask), on which torch.compile breaks its graph and fails to compile the backward.

        Raises:
            ConfigError: ``model.kernels.compile: true`` for a CNN model.
        """
        settings = super().resolve_settings(steps)
        if not self.is_cnn or not settings.compile:
            return settings
        self._refuse_compile()
        return replace(settings, compile=False)

    def _refuse_compile(self) -> None:
        if self.is_cnn and self.kernels.compile is True:
            raise ConfigError(
                f"model.kernels.compile: true cannot compile the CNN model ({self.model.config['encoder']}): "
                "its sparse BatchNorm gathers the visible positions of each batch (a shape that depends on "
                "the mask), which torch.compile cannot compile; set model.kernels.compile: auto or false"
            )
