"""Lightning refusing a setting while LightningCLI builds the run, read as the ``ConfigError`` of the key
it refuses (``trainer.max_epochs: -5`` -> "trainer.max_epochs: ... (refused by Lightning's Trainer)"), so
that the user sees one line, not a traceback."""

import inspect
import re
from types import FrameType

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from mae.compat.lightning import LIGHTNING_PACKAGES, builds_trainer
from mae.errors import ConfigError, UserError


def lightning_refusal(err: BaseException) -> ConfigError | None:
    """``err`` as the ``ConfigError`` of the setting it refuses, when it is Lightning refusing a setting of
    the trainer, a callback or a logger (a ``MisconfigurationException`` or ``ValueError`` raised in
    Lightning's own code while LightningCLI builds the Trainer, or jsonargparse a callback or logger, e.g.
    ``trainer.max_epochs: -5``): names the key (``trainer.max_epochs``) and Lightning's reason. Else None:
    an error raised in or through the project's code (our modules, callbacks, data) is a bug and keeps its
    traceback, and the project's own errors are left as they are."""
    refusal = _unwrapped(err)
    if not isinstance(refusal, (MisconfigurationException, ValueError)) or isinstance(refusal, UserError):
        return None
    built = _built_by_lightning(_frames(refusal))
    if built is None:
        return None
    section, listed = ("trainer", False) if isinstance(built, pl.Trainer) else _section(_frames(err))
    reason, name = str(refusal).strip(), type(built).__name__
    return ConfigError(
        f"{_refused_key(type(built), section, listed, reason)}: {reason} (refused by Lightning's {name})"
    )


def _frames(err: BaseException) -> list[FrameType]:
    """The frames of ``err``'s traceback, outermost first."""
    frames, tb = [], err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _package(frame: FrameType) -> str:
    return frame.f_globals.get("__name__", "").split(".")[0]


def _unwrapped(err: BaseException) -> BaseException | None:
    """``err`` without jsonargparse's wrapping of a class's error."""
    refusal: BaseException | None = err
    while refusal is not None and (frames := _frames(refusal)) and _package(frames[-1]) == "jsonargparse":
        refusal = refusal.__cause__ or refusal.__context__
    return refusal


def _built_by_lightning(frames: list[FrameType]) -> object | None:
    """The object being built when the error was raised, if a builder (jsonargparse, or LightningCLI
    building the Trainer: ``mae.compat.lightning.builds_trainer``) was building it and every frame from
    there to the raise is Lightning's."""
    builders = [
        i for i, frame in enumerate(frames) if _package(frame) == "jsonargparse" or builds_trainer(frame)
    ]
    if not builders or builders[-1] == len(frames) - 1:
        return None
    inside = frames[builders[-1] + 1 :]  # the class being built, down to the raise
    built = inside[0].f_locals.get("self")
    if built is None or any(_package(frame) not in LIGHTNING_PACKAGES for frame in inside):
        return None
    return built


def _refused_key(cls: type, section: str | None, listed: bool, reason: str) -> str:
    """The key refused: the section, with the first of ``cls``'s parameters that ``reason`` names."""
    parameters = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    named = sorted(
        (match.start(), p) for p in parameters if (match := re.search(rf"\b{re.escape(p)}\b", reason))
    )
    key = section or cls.__name__
    if not named:
        return key
    return f"{key} ({cls.__name__}.{named[0][1]})" if listed else f"{key}.{named[0][1]}"


def _section(frames: list[FrameType]) -> tuple[str | None, bool]:
    """The config section jsonargparse was building a class of, in the frames of its traceback (a group such
    as ``checkpoint``, or a typed key such as ``trainer.callbacks``, then True), or (None, False)."""
    for frame in reversed(frames):
        if _package(frame) != "jsonargparse":
            continue
        if frame.f_code.co_name == "group_instantiate_class" and isinstance(frame.f_locals.get("key"), str):
            return frame.f_locals["key"], False
        dest = getattr(frame.f_locals.get("self"), "dest", None)
        if frame.f_code.co_name == "instantiate_classes" and isinstance(dest, str):
            return dest, True
    return None, False
