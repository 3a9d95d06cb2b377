"""Progressive resolution: a pretraining run that spends its first epochs at lower input sizes and ends
at the evaluation size (``model.resolution_schedule``), the same patch size throughout.

A schedule is a list of ``[start, size]`` phases: ``start`` the fraction of ``trainer.max_epochs`` at
which the phase begins (the first at 0), ``size`` its input side in pixels; the last phase's size is
the run's ``data.img_size``, the size the model is built, checkpointed and evaluated at. E.g.
``[[0, 16], [0.8, 32]]``: 16 px for the first 80 % of the epochs, then 32 px.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from timm.layers import to_2tuple

from mae.errors import ConfigError
from mae.models.patch_grid import check_img_size


@dataclass(frozen=True)
class ResolutionSchedule:
    """``phases``: ((start fraction, (H, W)), ...), starts rising from 0, the last size the final one."""

    phases: tuple[tuple[float, tuple[int, int]], ...]

    @classmethod
    def parse(cls, value: list, final_size: int | tuple[int, int], patch_size: int) -> "ResolutionSchedule":
        """``value`` (``[[start, size], ...]``) checked against the run's final size and patch size.

        Raises:
            ValueError: naming ``model.resolution_schedule``, the phase and what would be right.
        """
        key = "model.resolution_schedule"
        final = to_2tuple(final_size)
        if not isinstance(value, list | tuple) or not value:
            raise ConfigError(
                f"{key}: a list of [start, size] phases, e.g. [[0, 16], [0.8, {final[0]}]]; got {value!r}"
            )
        phases = []
        for i, phase in enumerate(value):
            if not isinstance(phase, list | tuple) or len(phase) != 2:
                raise ConfigError(
                    f"{key}[{i}]: a [start, size] pair (start: a fraction of the epochs); got {phase!r}"
                )
            start, size = phase
            if isinstance(start, bool) or not isinstance(start, int | float) or not 0 <= start < 1:
                raise ConfigError(f"{key}[{i}]: start {start!r} must be a fraction of the epochs in [0, 1)")
            try:
                size = check_img_size(size, patch_size)
            except (TypeError, ValueError) as err:
                raise ConfigError(f"{key}[{i}]: {err}") from None
            phases.append((float(start), size))
        starts = [start for start, _ in phases]
        if starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
            raise ConfigError(
                f"{key}: the phases' starts must rise from 0 (the first phase starts the run); got {starts}"
            )
        if phases[-1][1] != final:
            raise ConfigError(
                f"{key}: the last phase's size {phases[-1][1][0]}x{phases[-1][1][1]} must be data.img_size "
                f"{final[0]}x{final[1]}, the size the model is checkpointed and evaluated at"
            )
        return cls(tuple(phases))

    def size_at(self, epoch: int, max_epochs: int) -> tuple[int, int]:
        """The input size of 0-based ``epoch`` of a ``max_epochs`` run: that of the last phase whose first
        epoch, ``floor(start * max_epochs)``, is at most ``epoch`` (a phase starts on a whole epoch, and a
        phase that starts before the end, the final one above all, is never left empty)."""
        size = self.phases[0][1]
        for start, phase_size in self.phases:
            if math.floor(start * max_epochs + 1e-9) <= epoch:
                size = phase_size
        return size


def resize_batch(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(N, C, H, W) images at ``size`` (H', W'): antialiased bilinear, as a lower-resolution view of the
    same crop; returned unchanged when already that size."""
    if tuple(images.shape[-2:]) == tuple(size):
        return images
    return F.interpolate(images, size=size, mode="bilinear", antialias=True, align_corners=False)
