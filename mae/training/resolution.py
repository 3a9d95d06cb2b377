"""Progressive resolution: a pretraining run that spends its first epochs at lower input sizes and ends
at the evaluation size (``model.resolution_schedule``), the same patch size throughout.

A schedule is a list of ``[start, size]`` phases: ``start`` the fraction of ``trainer.max_epochs`` at
which the phase begins (the first at 0), ``size`` its input side in pixels; the last phase's size is
the run's ``data.img_size``, the size the model is built, checkpointed and evaluated at. E.g.
``[[0, 16], [0.8, 32]]``: 16 px for the first 80 % of the epochs, then 32 px.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from timm.layers import to_2tuple

from mae.errors import ConfigError
from mae.models.patch_grid import check_img_size

KEY = "model.resolution_schedule"


@dataclass(frozen=True)
class ResolutionSchedule:
    """``phases``: ((start fraction, (H, W)), ...), starts rising from 0, the last size the final one."""

    phases: tuple[tuple[float, tuple[int, int]], ...]

    @classmethod
    def parse(
        cls,
        value: list,
        final_size: int | tuple[int, int],
        patch_size: int,
        check: Callable[[tuple[int, int]], None] | None = None,
    ) -> "ResolutionSchedule":
        """``value`` (``[[start, size], ...]``) checked against the run's final size and patch size, and
        each phase's size by ``check`` (raising ``ConfigError`` for an (H, W) the model cannot train at,
        e.g. a patch grid its mask ratio leaves no visible patch of).

        Raises:
            ConfigError: naming ``model.resolution_schedule``, the phase and what would be right.
        """
        final = to_2tuple(final_size)
        if not isinstance(value, list | tuple) or not value:
            raise ConfigError(
                f"{KEY}: a list of [start, size] phases, e.g. [[0, 16], [0.8, {final[0]}]]; got {value!r}"
            )
        phases = []
        for i, phase in enumerate(value):
            if not isinstance(phase, list | tuple) or len(phase) != 2:
                raise ConfigError(
                    f"{KEY}[{i}]: a [start, size] pair (start: a fraction of the epochs); got {phase!r}"
                )
            where = f"{KEY}[{i}] {list(phase)}"
            start, size = phase
            if isinstance(start, bool) or not isinstance(start, int | float) or not 0 <= start < 1:
                raise ConfigError(f"{where}: start {start!r} must be a fraction of the epochs in [0, 1)")
            if i == 0 and start != 0:
                raise ConfigError(f"{where}: the first phase starts the run, so its start must be 0")
            if i > 0 and start <= phases[-1][0]:
                raise ConfigError(
                    f"{where}: start {start} must be above the previous phase's start {phases[-1][0]:g} "
                    "(the phases' starts must rise from 0)"
                )
            size = _phase_size(size, patch_size, final, where)
            if i == len(value) - 1 and size != final:
                raise ConfigError(
                    f"{where}: the last phase's size {size[0]}x{size[1]} must be data.img_size "
                    f"{final[0]}x{final[1]}, the size the model is checkpointed and evaluated at"
                )
            if check is not None:
                _check_phase(check, size, patch_size, final, where)
            phases.append((float(start), size))
        return cls(tuple(phases))

    def first_epoch(self, phase: int, max_epochs: int) -> int:
        """The 0-based epoch at which ``phase`` (an index into ``phases``) starts in a ``max_epochs`` run:
        ``floor(start * max_epochs)``."""
        return math.floor(self.phases[phase][0] * max_epochs + 1e-9)

    def shown(self, phase: int) -> str:
        """``phase`` (an index into ``phases``) as a config writes it, e.g. ``[0.8, 32]``."""
        start, size = self.phases[phase]
        return f"[{start:g}, {size[0] if size[0] == size[1] else list(size)}]"

    def next_phase(self, epoch: int, max_epochs: int) -> int | None:
        """The index of the first phase that starts after 0-based ``epoch`` of a ``max_epochs`` run (the
        phase a run stopped in that epoch never reached), or None when every phase has started."""
        return next(
            (i for i in range(len(self.phases)) if self.first_epoch(i, max_epochs) > epoch),
            None,
        )

    def epochs_of(self, phase: int, max_epochs: int) -> int:
        """How many epochs of a ``max_epochs`` run ``phase`` (an index into ``phases``) trains: from its
        first epoch to the next phase's (the last phase: to the end)."""
        end = self.first_epoch(phase + 1, max_epochs) if phase + 1 < len(self.phases) else max_epochs
        return end - self.first_epoch(phase, max_epochs)

    def check_epochs(self, max_epochs: int) -> None:
        """Refuse a ``max_epochs`` run in which a phase gets no epoch: phases start on whole epochs
        (``first_epoch``), so one whose start rounds down to the next phase's would never train (its size
        silently left out, e.g. ``[[0, 16], [0.8, 32]]`` in a 1-epoch run trains only at 32 px).

        Raises:
            ConfigError: naming the phase, its start fraction, ``trainer.max_epochs``, the epoch both
                phases would start at and the smallest ``trainer.max_epochs`` that gives every phase one.
        """
        for i in range(len(self.phases) - 1):  # the last starts below max_epochs: never empty
            if self.epochs_of(i, max_epochs) > 0:
                continue
            first = self.first_epoch(i, max_epochs)
            raise ConfigError(
                f"{KEY}[{i}] {self.shown(i)}: this phase gets 0 epochs of trainer.max_epochs={max_epochs}: "
                f"it and the next phase {self.shown(i + 1)} both start at epoch {first + 1} (a phase starts "
                f"on a whole epoch, floor(start x max_epochs) + 1), so {self.phases[i][1][0]}x"
                f"{self.phases[i][1][1]} px would never be trained. Set "
                f"trainer.max_epochs to at least {self._smallest_max_epochs(max_epochs)} (every phase then "
                "gets an epoch), or remove this phase"
            )

    def _smallest_max_epochs(self, above: int) -> int:
        """The smallest ``max_epochs`` over ``above`` in which every phase gets an epoch (one exists: a
        run of ``1 / (the smallest gap between starts)`` epochs gives each phase at least one)."""
        max_epochs = above + 1
        while any(self.epochs_of(i, max_epochs) == 0 for i in range(len(self.phases))):
            max_epochs += 1
        return max_epochs

    def check_run_length(self, max_epochs: int, steps_per_epoch: int, max_steps: int) -> None:
        """Refuse a ``max_steps`` cap (-1: none) that ends a run of ``max_epochs`` epochs of
        ``steps_per_epoch`` optimizer steps before one of its phases starts: the run would checkpoint the
        final-size model without training it at that size.

        Raises:
            ConfigError: naming the phase, ``trainer.max_steps``, the phase's first step and the fixes.
        """
        if max_steps < 1:  # none, or a run of 0 steps (refused with the optimizer)
            return
        for i in range(len(self.phases)):
            first_step = self.first_epoch(i, max_epochs) * steps_per_epoch
            if first_step >= max_steps:
                raise ConfigError(
                    f"{KEY}[{i}] {self.shown(i)}: trainer.max_steps={max_steps} ends the run before this "
                    f"phase starts, at step {first_step} (epoch {self.first_epoch(i, max_epochs) + 1} of "
                    f"trainer.max_epochs={max_epochs}, {steps_per_epoch} steps per epoch): its checkpoints "
                    f"would hold a {self.phases[-1][1][0]}x{self.phases[-1][1][1]} model trained only at "
                    f"smaller sizes. The phases start at fractions of trainer.max_epochs: raise "
                    f"trainer.max_steps above {first_step}, or set trainer.max_epochs to the run's length "
                    "instead"
                )

    def size_at(self, epoch: int, max_epochs: int) -> tuple[int, int]:
        """The input size of 0-based ``epoch`` of a ``max_epochs`` run: that of the last phase whose first
        epoch, ``floor(start * max_epochs)``, is at most ``epoch`` (a phase starts on a whole epoch, and a
        phase that starts before the end, the final one above all, is never left empty)."""
        size = self.phases[0][1]
        for i, (_, phase_size) in enumerate(self.phases):
            if self.first_epoch(i, max_epochs) <= epoch:
                size = phase_size
        return size


def _phase_size(size: object, patch_size: int, final: tuple[int, int], where: str) -> tuple[int, int]:
    """A phase's ``size`` (a side, or [H, W]) as (H, W) pixels, checked: whole patches, and at most the
    final size ``final`` (the data is cropped at the final size: a larger phase would upsample it)."""
    sides = size if isinstance(size, list | tuple) and len(size) == 2 else [size]
    if not all(isinstance(side, int) and not isinstance(side, bool) for side in sides):
        raise ConfigError(f"{where}: size {size!r} must be a number of pixels, or a [height, width] pair")
    try:
        size = check_img_size(tuple(size) if isinstance(size, list) else size, patch_size)
    except ConfigError as err:
        raise ConfigError(f"{where}: the phase's {err}") from None
    if size[0] > final[0] or size[1] > final[1]:
        raise ConfigError(
            f"{where}: size {size[0]}x{size[1]} is above data.img_size {final[0]}x{final[1]}, the final "
            "size: the images are cropped at data.img_size, so a larger phase would train on them "
            f"upsampled; use at most {_side(final)} (a multiple of patch_size {patch_size}), or raise "
            "data.img_size"
        )
    return size


def _check_phase(
    check: Callable[[tuple[int, int]], None],
    size: tuple[int, int],
    patch_size: int,
    final: tuple[int, int],
    where: str,
) -> None:
    """``check(size)``, its error naming the phase (``where``) and the smallest square size (whole
    patches, at most ``final``) that ``check`` passes."""
    try:
        check(size)
    except ConfigError as err:
        smallest = None
        for side in range(patch_size, min(final) + 1, patch_size):
            try:
                check((side, side))
            except ConfigError:
                continue
            smallest = side
            break
        fix = (
            f"the smallest phase size that trains at these settings is {smallest}"
            if smallest is not None
            else f"no square size up to {min(final)} trains at these settings"
        )
        raise ConfigError(
            f"{where}: at {size[0]}x{size[1]} px, a {size[0] // patch_size}x{size[1] // patch_size} patch "
            f"grid: {err}; {fix} (a multiple of patch_size {patch_size}, at most data.img_size "
            f"{_side(final)})"
        ) from None


def _side(size: tuple[int, int]) -> str:
    """``32`` for a square (H, W), ``32x48`` otherwise."""
    return str(size[0]) if size[0] == size[1] else f"{size[0]}x{size[1]}"


def resize_batch(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(N, C, H, W) images at ``size`` (H', W'): antialiased bilinear, as a lower-resolution view of the
    same crop; returned unchanged when already that size."""
    if tuple(images.shape[-2:]) == tuple(size):
        return images
    return F.interpolate(images, size=size, mode="bilinear", antialias=True, align_corners=False)
