"""The frozen teacher of feature targets (``model.target features``) and distillation: any encoder
``mae.load_backbone`` reads, loaded once, frozen, with a record of what it is (``TeacherIdentity``) for the
run's hyperparameters, its checkpoints and its model card.

What a caller can rely on (``load_teacher``):

- the teacher is a timm ``VisionTransformer`` in eval mode whose every parameter has ``requires_grad``
  False; its ``forward_intermediates`` gives each block's tokens, ``blocks`` / ``patch_embed`` /
  ``num_prefix_tokens`` are timm's;
- it takes inputs of any size its patches divide (``dynamic_img_size``: the position embeddings are
  resampled per input grid by timm; at ``img_size`` they are those ``load_backbone`` resampled once, as the
  official MAE does), with ``in_chans`` channels;
- it is a plain module of its own: the caller keeps it out of any model it trains (no registered
  submodule, so never in a state dict, an optimizer, a DDP / FSDP2 wrapper or a checkpoint) and moves it to
  the images' device itself;
- ``TeacherIdentity.sha256`` is the same for the same weights, whichever path or copy they are read from,
  so a resumed run can check it reads the teacher it started with (``check_same_teacher``).
"""

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from timm.models.vision_transformer import VisionTransformer

from mae.convert.backbone import load_backbone
from mae.convert.sources import read_checkpoint
from mae.errors import ConfigError, MissingFileError

TEACHER_SETTING = "model.teacher.checkpoint"  # the key that names a teacher, in every message
# The files of a checkpoint folder that hold weights (safetensors, torch pickles, distributed-checkpoint
# shards and their index); its other files (config.json, README.md, ...) describe them.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".ckpt", ".distcp", ".metadata")
_CHUNK = 1 << 20  # bytes hashed at a time


@dataclass(frozen=True)
class TeacherIdentity:
    """What a teacher is, as a run records it (hyperparameters, checkpoints, model card).

    Attributes:
        path: the checkpoint file or folder, resolved to an absolute path.
        sha256: hex digest of the file, or of the folder's weight files (``checkpoint_sha256``).
        format: the checkpoint format read (a name of ``mae.convert.sources.FORMATS``).
        embed_dim: the teacher's token width D_teacher.
        patch_size: its patch side in pixels.
        depth: its number of blocks.
        num_heads: its attention heads.
    """

    path: str
    sha256: str
    format: str
    embed_dim: int
    patch_size: int
    depth: int
    num_heads: int

    def record(self) -> dict[str, Any]:
        """The identity as plain values (a checkpoint's or a YAML file's)."""
        return asdict(self)

    def described(self) -> str:
        """One line for logs and messages."""
        return (
            f"{self.path} ({self.format}, sha256 {self.sha256[:12]}..., {self.depth} blocks of width "
            f"{self.embed_dim}, {self.patch_size}-px patches)"
        )


def checkpoint_sha256(path: str | Path) -> str:
    """The sha256 of a checkpoint: of the file's bytes, or, for a folder, of its weight files
    (``WEIGHT_SUFFIXES``, or every file when it has none), each as its path relative to the folder and its
    bytes, in sorted order, so a copy of the folder elsewhere has the same hash."""
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_file():
        _hash_file(digest, path)
        return digest.hexdigest()
    files = sorted(p for p in path.rglob("*") if p.is_file())
    weights = [p for p in files if p.suffix in WEIGHT_SUFFIXES] or files
    for file in weights:
        digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        _hash_file(digest, file)
    return digest.hexdigest()


def _hash_file(digest: Any, path: Path) -> None:
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)


def load_teacher(
    checkpoint: str | Path,
    checkpoint_format: str = "auto",
    *,
    img_size: int | tuple[int, int] | None = None,
    grid_size: tuple[int, int] | None = None,
    in_chans: int | None = None,
    setting: str = TEACHER_SETTING,
) -> tuple[VisionTransformer, TeacherIdentity]:
    """The encoder of ``checkpoint`` as a frozen teacher, and its identity.

    Args:
        checkpoint: any file or folder ``mae.load_backbone`` reads (our Lightning checkpoints, official MAE
            files, timm files and folders, Hugging Face folders, our export folders).
        checkpoint_format: "auto" or a name of ``mae.convert.sources.FORMATS``.
        img_size: the input size (H, W) the teacher will mostly see; its position embeddings are resampled
            for it once (None: the size it was trained at). Other sizes still work (``dynamic_img_size``).
        grid_size: instead of ``img_size``, the patch grid (h, w) it will mostly see: ``img_size`` is then h
            and w of its own patches (as ``FeaturesTarget`` feeds a teacher of a student with that grid).
        in_chans: the channels of the images it will see, when they differ from the checkpoint's (the
            patch embedding is adapted as ``load_backbone`` does: exact for 1-channel images of an RGB
            teacher, which is the same as repeating the channel).
        setting: the key that named ``checkpoint``, for the messages.

    Returns:
        (teacher, identity): a timm ``VisionTransformer`` in eval mode with ``requires_grad`` False on
        every parameter, on the CPU, in float32; and its ``TeacherIdentity``.

    Raises:
        MissingFileError: ``checkpoint`` does not exist, naming ``setting``.
        InputError, ConfigError: what ``read_checkpoint`` / ``load_backbone`` refuse, naming the file.
    """
    path = Path(checkpoint).expanduser()
    if not path.exists():
        raise MissingFileError(
            f"{setting} {checkpoint} does not exist: point it at a pretrained encoder (our runs' "
            "checkpoints, official MAE, timm or Hugging Face weights, an export folder), e.g. the "
            "last.ckpt of a `mae pretrain` run"
        )
    ckpt = read_checkpoint(path, checkpoint_format)
    if ckpt.family != "vit":
        raise ConfigError(
            f"{setting} {checkpoint} holds the CNN {ckpt.config.get('encoder')}; a teacher must be a ViT "
            "(its tokens are the targets, one per patch): give a ViT checkpoint"
        )
    if grid_size is not None:
        if img_size is not None:
            raise ValueError("load_teacher takes img_size or grid_size, not both")
        img_size = (grid_size[0] * ckpt.config["patch_size"], grid_size[1] * ckpt.config["patch_size"])
    teacher = load_backbone(ckpt, img_size, in_chans=in_chans, dynamic_img_size=True)
    teacher.requires_grad_(False)
    teacher.eval()
    config = teacher.load_report.config
    identity = TeacherIdentity(
        path=str(path.resolve()),
        sha256=checkpoint_sha256(path),
        format=ckpt.format,
        embed_dim=teacher.embed_dim,
        patch_size=int(config["patch_size"]),
        depth=len(teacher.blocks),
        num_heads=int(config["num_heads"]),
    )
    return teacher, identity


def check_teacher_settings(target: str, settings: Any) -> None:
    """Refuse, at start-up, a teacher without the target that reads one, and that target without a teacher.

    Args:
        target: ``model.target``.
        settings: ``model.teacher`` (``mae.training.settings.TeacherSettings``).

    Raises:
        ConfigError: naming ``model.target`` and the ``model.teacher`` keys set.
    """
    defaults = type(settings)()
    given = [
        f"model.teacher.{name}"
        for name in vars(defaults)
        if getattr(settings, name) != getattr(defaults, name)
    ]
    if target != "features" and given:
        raise ConfigError(
            f"{', '.join(given)} set, but model.target is {target}: a teacher is read only for model.target "
            "features; set model.target features, or leave model.teacher out"
        )
    if target == "features" and settings.checkpoint is None:
        raise ConfigError(
            f"model.target features regresses a frozen teacher's tokens, but {TEACHER_SETTING} is not set: "
            "point it at a pretrained encoder (e.g. the last.ckpt of a `mae pretrain` run, or timm / Hugging "
            "Face weights)"
        )


def check_same_teacher(
    recorded: dict[str, Any], identity: TeacherIdentity, setting: str = TEACHER_SETTING
) -> None:
    """Refuse to go on with a teacher whose weights differ from those a run recorded when it started.

    Args:
        recorded: the run's ``TeacherIdentity.record()``, as its checkpoint holds it.
        identity: the teacher read now.

    Raises:
        ConfigError: naming ``setting``, both paths and both hashes.
    """
    if recorded.get("sha256") != identity.sha256:
        raise ConfigError(
            f"{setting} {identity.path} has sha256 {identity.sha256}, but the run being resumed was trained "
            f"with the teacher {recorded.get('path')} of sha256 {recorded.get('sha256')}: resume with that "
            "teacher (the targets would change mid-run otherwise), or start a new run"
        )
