"""What the decoder regresses for each patch (``model.target``): one interface (``PatchTarget``, in
``base``) and one table of its members. A new target is a file here, a row of ``TARGETS`` and its test.

- ``pixel``: the patch's pixels (the paper's plain target), p*p*C values;
- ``norm_pix``: the pixels normalised per patch (the paper's ``norm_pix_loss``), p*p*C values;
- ``hog``: MaskFeat's histograms of oriented gradients, 2 x 2 cells x C x 9 bins;
- ``features``: a frozen teacher encoder's tokens (MILAN, data2vec), D_teacher values; the only target with
  options (``target_options``) and a module handed in (``FeaturesTarget.set_teacher``).
"""

from typing import Any

from mae.errors import ConfigError
from mae.models.targets.base import PatchTarget
from mae.models.targets.features import FeaturesTarget
from mae.models.targets.hog import HOGTarget
from mae.models.targets.norm_pix import NormPixTarget
from mae.models.targets.pixel import PixelTarget

TARGETS: dict[str, type[PatchTarget]] = {
    cls.name: cls for cls in (PixelTarget, NormPixTarget, HOGTarget, FeaturesTarget)
}


def target_class(name: str) -> type[PatchTarget]:
    """The member of ``TARGETS`` called ``name``.

    Raises:
        ConfigError: an unknown name, listing the known ones.
    """
    if name not in TARGETS:
        raise ConfigError(f"model.target must be one of {', '.join(TARGETS)}; got {name!r}")
    return TARGETS[name]


def build_target(
    name: str, patch_size: int, in_chans: int, options: dict[str, Any] | None = None
) -> PatchTarget:
    """The target ``name`` for patches of ``patch_size`` px with ``in_chans`` channels and its ``options``
    (``features``: ``FeaturesTarget``'s dim, block, normalize and teacher).

    Raises:
        ConfigError: an unknown name, options for a target that takes none, or options it does not take.
    """
    cls = target_class(name)
    unknown = sorted(set(options or {}) - set(cls.option_names))
    if unknown:
        takes = ", ".join(cls.option_names) or "none"
        raise ConfigError(f"model.target {name} takes the target_options {takes}; got {', '.join(unknown)}")
    return cls(patch_size, in_chans, **(options or {}))


def target_of(config: dict[str, Any]) -> str:
    """The target a model ``config`` (a checkpoint's or ``MaskedAutoencoderViT.config``) was trained with:
    its ``target``, else the one its ``norm_pix_loss`` (how 0.4.0 and earlier, the official MAE and Hugging
    Face record it) names."""
    if config.get("target") is not None:
        return config["target"]
    return "norm_pix" if config.get("norm_pix_loss") else "pixel"


__all__ = ["TARGETS", "PatchTarget", "build_target", "target_class", "target_of"]
