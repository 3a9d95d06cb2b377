"""The options several ``mae`` commands share, each defined once: its one spelling, type, default and the
part of its help every command repeats. A command adds them with ``add_option(parser, "device")`` and
gives only what is its own (what ``--out`` holds, whether ``--checkpoint`` is required); the checkpoint
pair with ``add_checkpoint``.

Flag spelling, one convention per family of commands (``tests/unit/cli/test_main.py`` checks every
parser): the training commands (``pretrain``, ``finetune``, ``detect``, ``segment``: LightningCLI) spell
every flag with underscores, as the YAML key it sets (``--trainer.max_epochs``, ``--ckpt_path``,
``--find_batch_size``); every other command spells its flags with hyphens (``--max-image-pixels``,
``--checkpoint-format``), and a flag's ``dest`` is its underscored name.

The spellings 0.2 renamed (``--format``, ``--k``, ``--max_epochs``, ...) were removed in 0.3.0; given
one, a command stops with an error naming the new spelling (``refuse_removed``). Nothing here imports
torch until a command runs.
"""

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentParser, DefaultHelpFormatter, Namespace
from jsonargparse.typing import NonNegativeInt, OpenUnitInterval, PositiveFloat, PositiveInt

from mae.errors import ALLOWED, ConfigError, UsageError

# Attribute set on every action ``add_option`` creates (its help is complete: see ``CommandHelpFormatter``);
# tests check that no command makes a shared option by hand.
SHARED_MARK = "mae_shared_option"
DEVICE_DEFAULT = "cuda when available, else cpu"
# ``--checkpoint``'s own words in the commands that need the decoder too (reconstruct, demo, anomaly's mae).
DECODER_CHECKPOINT = "a checkpoint with a decoder (ours, official full, Hugging Face)"


class OutOfRange(argparse.ArgumentTypeError, ValueError):
    """A number outside its flag's range: argparse words it as its message alone; jsonargparse, reading
    the value from a ``--config`` file, as a ``ValueError`` of the key."""


class _ArgparseNumber:
    """The type of a number flag read as argparse reads it: a bad value refused in argparse's words
    ("argument --seed: invalid int value: 'x'", from ``__name__``), not jsonargparse's, and ``nan`` /
    ``inf`` read as floats (so the command's own check names them; jsonargparse's ``float`` reads YAML,
    which spells them ``.nan`` / ``.inf``). Shown in ``--help`` as ``int`` / ``float``.

    ``bound``: a jsonargparse restricted number type (a key of ``ALLOWED``) the value must satisfy, checked
    by the parser: a value outside it stops the command with one line naming the flag and the range
    ("argument -k: must be at least 1, got 0"), exit status 2, before anything is loaded."""

    def __init__(self, kind: type, bound: type | None = None) -> None:
        self.kind, self.bound = kind, bound
        self.__name__ = kind.__name__

    def __call__(self, text: str) -> int | float:
        value = self.kind(text)
        if self.bound is not None:
            try:
                self.bound(value)
            except ValueError:
                raise OutOfRange(f"must be {ALLOWED[self.bound]}, got {text}") from None
        return value

    def __repr__(self) -> str:
        return self.kind.__name__


argparse_int = _ArgparseNumber(int)
argparse_float = _ArgparseNumber(float)
positive_int = _ArgparseNumber(int, PositiveInt)
non_negative_int = _ArgparseNumber(int, NonNegativeInt)
positive_float = _ArgparseNumber(float, PositiveFloat)
fraction = _ArgparseNumber(float, OpenUnitInterval)  # strictly between 0 and 1


def _pil_pixel_limit() -> int:
    from mae.data.decoding.limits import DEFAULT_MAX_PIXELS  # imports torch: only once a parser is built

    return DEFAULT_MAX_PIXELS


@dataclass(frozen=True)
class SharedOption:
    """One shared option: ``flags`` (its only spelling), ``help`` (what every command says; a command's
    own words come after it), the ``add_argument`` keywords every command uses, ``default_help``: how
    ``--help`` states the default when the value alone would not say it, and ``default_factory``: the
    default every command uses, where it lives in a layer that imports torch."""

    flags: tuple[str, ...]
    help: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    default_help: str | None = None
    default_factory: Callable[[], Any] | None = None


SHARED_OPTIONS = {
    "checkpoint": SharedOption(
        ("--checkpoint",),
        "our .ckpt, an official MAE .pth, a timm state dict, a Hugging Face folder or an exported encoder",
    ),
    "checkpoint_format": SharedOption(
        ("--checkpoint-format",),
        "the checkpoint's format",
        {"default": "auto"},
        "auto, detected from the file",
    ),
    "out": SharedOption(("--out",), "", {"type": Path}),
    "img_size": SharedOption(
        ("--img-size",), "input size in pixels", {"type": positive_int, "default": None}, "the checkpoint's"
    ),
    "batch_size": SharedOption(("--batch-size",), "images per forward pass", {"type": positive_int}),
    "workers": SharedOption(
        ("--workers",), "worker processes (0: none, all in this process)", {"type": non_negative_int}
    ),
    "device": SharedOption(("--device",), "cpu, cuda, cuda:1, ...", {"default": None}, DEVICE_DEFAULT),
    "k": SharedOption(("-k",), "neighbours", {"type": positive_int}),
    "feature_blocks": SharedOption(
        ("--feature-blocks",),
        "the encoder blocks whose features are read, 0 the first, -1 the last (a CNN's: its stages); several "
        "are concatenated, each pooled as the last block is (a ViT block through the encoder's final norm)",
        {"type": argparse_int, "nargs": "+", "default": None},
        "the last block",
    ),
    "max_image_pixels": SharedOption(
        ("--max-image-pixels",),
        "the largest image read, in pixels (a larger one is refused as a decompression bomb)",
        {"type": argparse_int},
        "PIL's decompression-bomb limit, %(default)s",
        _pil_pixel_limit,
    ),
    "mean": SharedOption(
        ("--mean",),
        "per-channel input mean",
        {"type": argparse_float, "nargs": "+", "default": None},
        "the checkpoint's record",
    ),
    "std": SharedOption(
        ("--std",),
        "per-channel input std",
        {"type": argparse_float, "nargs": "+", "default": None},
        "the checkpoint's record",
    ),
}

# Spellings removed in 0.3.0 -> the one to use (renamed in 0.2, accepted with a note until 0.3.0).
REMOVED = {
    "--format": "--checkpoint-format",
    "--checkpoint_format": "--checkpoint-format",
    "--k": "-k",
    "--max_epochs": "--max-epochs",
    "--weight_decays": "--weight-decays",
    "--num_heads": "--num-heads",
    "--img_size": "--img-size",
    "--batch_size": "--batch-size",
    "--mask_ratio": "--mask-ratio",
    "--max_image_pixels": "--max-image-pixels",
}


def add_option(parser: ArgumentParser | Any, name: str, own_help: str = "", **kwargs: Any) -> argparse.Action:
    """Add the shared option ``name`` (a key of ``SHARED_OPTIONS``) to ``parser`` (or an argument group).
    ``own_help``: the command's own words after the shared help ("default: ..." states the default);
    ``kwargs``: what is the command's own (``required``, a ``default``, ...); ``checkpoint_format`` takes
    ``choices=mae.convert.sources.FORMATS``.

    Raises:
        ValueError: a ``--device`` default (every command's is ``DEVICE_DEFAULT``), a
            ``--checkpoint-format`` without its choices.
    """
    option = SHARED_OPTIONS[name]
    settings = {**option.kwargs, **kwargs}
    if option.default_factory is not None and "default" not in settings:
        settings["default"] = option.default_factory()
    if name == "checkpoint_format" and "choices" not in settings:  # the readers' table lives above this layer
        raise ConfigError("--checkpoint-format needs choices=mae.convert.sources.FORMATS")
    if name == "device" and settings.get("default") is not None:
        raise ConfigError(
            f"--device's default is {DEVICE_DEFAULT} in every command, not {settings['default']}"
        )
    default_help = option.default_help
    if own_help.startswith("default: "):  # the command's own default in words
        own_help, default_help = "", own_help.removeprefix("default: ")
    help_text = "; ".join(part for part in (option.help, own_help) if part)
    if settings.get("required"):
        help_text += " (required)"
    elif default_help is not None:
        help_text += f" (default: {default_help})"
    elif settings.get("default") is not None and "default:" not in help_text:
        help_text += " (default: %(default)s)"
    action = parser.add_argument(*option.flags, dest=name, help=help_text, **settings)
    setattr(action, SHARED_MARK, name)
    return action


def add_checkpoint(
    parser: ArgumentParser | Any, formats: tuple[str, ...], own_help: str = "", **kwargs: Any
) -> None:
    """``--checkpoint`` (``own_help`` and ``kwargs``: ``add_option``'s) and ``--checkpoint-format`` (one of
    ``formats``: ``mae.convert.sources.FORMATS``), the pair every command that reads a checkpoint takes."""
    add_option(parser, "checkpoint", own_help, **kwargs)
    add_option(parser, "checkpoint_format", choices=formats)


class CommandHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help, except for the shared options, whose help already says what matters (their
    default in words, "cuda when available, else cpu", not "null")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if getattr(action, SHARED_MARK, None):
            return action.help or ""
        return super()._get_help_string(action)


def resolve_device(device: str | None) -> str:
    """``--device`` as given, or cuda when available, else cpu."""
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def refuse_removed(parser: ArgumentParser, argv: list[str]) -> None:
    """Stop with the parser's error (exit status 2) at the first option of ``argv`` spelt as before 0.3.0
    (``REMOVED``), naming the spelling to use. Everything after a bare ``--`` is left alone."""
    for token in argv:
        if token == "--":
            return
        flag = token.partition("=")[0]
        if flag in REMOVED:
            parser.error(f"{flag} was renamed {REMOVED[flag]} (the old spelling was removed in 0.3.0)")


def finish_shared(args: Namespace) -> Namespace:
    """The shared options' values as a command uses them: ``device`` resolved (cuda when available);
    ``--mean`` and ``--std`` given together, one value each per channel.

    Raises:
        UsageError: one of ``--mean`` / ``--std`` without the other, or of another length.
    """
    if "device" in args:
        args.device = resolve_device(args.device)
    if "mean" in args and "std" in args:
        if (args.mean is None) != (args.std is None):
            raise UsageError("give --mean and --std together")
        if args.mean is not None and len(args.mean) != len(args.std):
            raise UsageError("--mean and --std need the same number of values, one per channel")
    return args
