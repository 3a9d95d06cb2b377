"""A frozen teacher's tokens as the target (MILAN, EVA, data2vec): the decoder regresses, for each masked
patch, the token a pretrained encoder gives that patch when it sees the whole, unmasked image.

The teacher is a timm ``VisionTransformer`` (``mae.training.teacher.load_teacher`` reads one from any
checkpoint ``mae.load_backbone`` takes) handed in by the training layer (``set_teacher``); this module never
reads a file. It is held outside the module tree, so it is never in the student's state dict, optimizer,
DDP / FSDP2 wrapping or checkpoint, and ``MaskedAutoencoderViT.initialize_weights`` never reaches it; the
target moves it to the images' device and dtype itself and runs it frozen, in eval mode, under
``torch.no_grad()``, once per step on the full image.

Its tokens are those after block ``block`` (0-based), prefix tokens (cls, registers) dropped, one per
patch of the student's grid: a teacher with other patches sees the image resized so that its grid is the
student's (e.g. a 16-px-patch teacher of a 4-px-patch student on 32x32 px images sees them at 128x128).
``normalize``: each token through a LayerNorm without affine over its D_teacher channels, as data2vec and
MILAN do. D_target = D_teacher.

A model trained on this target reloads without its teacher (``mae.load_mae``; the encoder through
``mae.load_backbone``): its architecture record keeps the options (``dim``, ``block``, ``normalize``,
``teacher``: the teacher's identity); such a target raises ``ConfigError`` if asked to compute.

References: Wei et al., "MILAN: Masked Image Pretraining on Language Assisted Representation" (2022);
Baevski et al., "data2vec 2.0" (2022).
"""

from typing import Any

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from mae.errors import ConfigError
from mae.models.targets.base import PatchTarget

SETTING = "model.teacher.checkpoint"  # the key that names the teacher, in every message


class _Unregistered:
    """Holds a module out of its owner's module tree (not in its ``state_dict``, ``parameters``, ``to``,
    ``apply``)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module


class FeaturesTarget(PatchTarget):
    """The tokens of block ``block`` of a frozen teacher, one per patch: D_target = ``dim``, the teacher's
    width.

    Args:
        patch_size: the student's patch side p in pixels.
        in_chans: image channels C.
        dim: D_teacher, the teacher's token width (what ``decoder_pred`` is sized by).
        block: the teacher block whose output tokens are the targets, 0-based (negative: from the end).
        normalize: each token through a LayerNorm without affine over its channels.
        teacher: the teacher's identity (``mae.training.teacher.TeacherIdentity.record()``: path, sha256,
            format, widths), as recorded for the run; None when unknown.

    Raises:
        ConfigError: ``dim`` not given (no teacher named), naming ``model.teacher.checkpoint``.
    """

    name = "features"
    described = "a frozen teacher encoder's tokens"
    option_names = ("dim", "block", "normalize", "teacher")

    def __init__(
        self,
        patch_size: int,
        in_chans: int,
        dim: int | None = None,
        block: int = -1,
        normalize: bool = True,
        teacher: dict[str, Any] | None = None,
    ) -> None:
        if dim is None:
            raise ConfigError(
                f"model.target features regresses a teacher's tokens, but no teacher is named: set {SETTING} "
                "(any encoder mae.load_backbone reads); in Python, build the model with "
                "target_options=dict(dim=<the teacher's width>, ...) and hand the teacher to set_teacher"
            )
        self.teacher_dim = int(dim)
        super().__init__(patch_size, in_chans)
        self.block = int(block)
        self.normalize = bool(normalize)
        self.identity = dict(teacher) if teacher is not None else None
        self._teacher: _Unregistered | None = None

    def width(self, patch_size: int, in_chans: int) -> int:
        return self.teacher_dim

    def recorded_options(self) -> dict[str, Any]:
        """What rebuilds this target without its teacher (``MaskedAutoencoderViT``'s ``target_options``)."""
        return dict(dim=self.teacher_dim, block=self.block, normalize=self.normalize, teacher=self.identity)

    @property
    def source(self) -> str:
        """The teacher's path, for messages."""
        return (self.identity or {}).get("path", "(the teacher)")

    @property
    def teacher(self) -> VisionTransformer | None:
        """The frozen teacher, None until ``set_teacher``."""
        return None if self._teacher is None else self._teacher.module

    def set_teacher(self, teacher: VisionTransformer, grid_size: tuple[int, int]) -> None:
        """Take ``teacher`` (frozen here: eval mode, ``requires_grad`` False), checked now, at start-up,
        against this target and the student's (h, w) ``grid_size``: its width is ``dim``, ``block`` one of
        its blocks, and one dry run on a blank image gives one token per patch of the grid.

        Raises:
            ConfigError: naming ``model.teacher.block`` and the teacher's depth, or
                ``model.teacher.checkpoint`` and both grids.
        """
        depth = len(teacher.blocks)
        if not -depth <= self.block < depth:
            raise ConfigError(
                f"model.teacher.block {self.block} is not a block of the teacher {self.source}, which has "
                f"depth {depth}: choose 0 to {depth - 1} (or -{depth} to -1 from the end)"
            )
        if teacher.embed_dim != self.teacher_dim:
            raise ConfigError(
                f"{SETTING} {self.source} gives tokens of width {teacher.embed_dim}, but this model's "
                f"decoder_pred predicts {self.teacher_dim}: build the model with target_options dim "
                f"{teacher.embed_dim}"
            )
        teacher.requires_grad_(False)
        self._teacher = _Unregistered(teacher.eval())
        self.check_grid(grid_size)

    def check_grid(self, grid_size: tuple[int, int]) -> None:
        """Raise ``ConfigError`` naming ``model.teacher.checkpoint`` and both grids when the teacher, fed the
        image of an (h, w) student grid (resized to h x w of its own patches), does not give one token per
        patch: one dry run on a blank image. Nothing to check before ``set_teacher``."""
        if self.teacher is None:
            return
        h, w = grid_size
        device = next(self.teacher.parameters()).device
        blank = torch.zeros(1, self.in_chans, h * self.patch_size, w * self.patch_size, device=device)
        size = self.teacher_input_size(grid_size)
        try:
            tokens = self.teacher_tokens(blank)
        except RuntimeError as error:  # a patch or position embedding that cannot take the size
            raise self.grid_error(grid_size, size, f"it cannot take them: {error}") from None
        if tokens.shape[1] != h * w:
            raise self.grid_error(grid_size, size, f"it gives {tokens.shape[1]} patch tokens")

    def teacher_input_size(self, grid_size: tuple[int, int]) -> tuple[int, int]:
        """(H, W) px the teacher sees for the student's (h, w) grid: h and w of its own patches."""
        p = self.teacher.patch_embed.patch_size
        return grid_size[0] * p[0], grid_size[1] * p[1]

    def grid_error(self, grid: tuple[int, int], size: tuple[int, int], why: str) -> ConfigError:
        """The error for a teacher whose patch grid cannot map onto the student's (h, w) ``grid``."""
        return ConfigError(
            f"{SETTING} {self.source}: its patch grid at {size[0]}x{size[1]} px cannot map onto the "
            f"student's {grid[0]}x{grid[1]} grid ({why}); choose a teacher with a plain ViT patch embedding "
            "(non-overlapping patches), or a student whose grid it can take"
        )

    @torch.compiler.disable  # the teacher is no part of the compiled student
    @torch.no_grad()
    def teacher_tokens(self, imgs: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) images (the student's input) -> (N, L', D_teacher) tokens of block ``block``, prefix
        tokens dropped, not normalised; L' is L for a teacher that maps (``set_teacher`` checks)."""
        teacher = self.teacher
        if teacher is None:
            raise ConfigError(
                f"model.target features: this model was trained on the tokens of the teacher {self.source}, "
                f"which is not loaded, so its target cannot be computed; to train or evaluate its loss, set "
                f"{SETTING} (mae pretrain reads it); its encoder serves features and fine-tuning without it "
                "(mae.load_backbone)"
            )
        first = next(teacher.parameters())
        if first.device != imgs.device or (imgs.is_floating_point() and first.dtype != imgs.dtype):
            teacher.to(device=imgs.device, dtype=imgs.dtype)
        teacher.eval()
        h, w = imgs.shape[-2] // self.patch_size, imgs.shape[-1] // self.patch_size
        size = self.teacher_input_size((h, w))
        if tuple(imgs.shape[-2:]) != size:
            imgs = F.interpolate(imgs, size=size, mode="bicubic", align_corners=False, antialias=True)
        block = self.block % len(teacher.blocks)
        (tokens,) = teacher.forward_intermediates(
            imgs, indices=[block], stop_early=True, output_fmt="NLC", intermediates_only=True
        )
        return tokens

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) images -> (N, L, D_teacher) targets, patches row-major as the student's."""
        tokens = self.teacher_tokens(imgs)
        if self.normalize:
            tokens = F.layer_norm(tokens, tokens.shape[-1:])
        return tokens

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, block={self.block}, normalize={self.normalize}, teacher={self.source}"
        )
