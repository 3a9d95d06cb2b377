"""Reading checkpoint files as untrusted input: tensors and plain data only, never arbitrary code."""

import argparse
import pickle
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from mae.errors import InputError, MissingFileError

# What real MAE checkpoints hold besides tensors and plain containers: the official training
# script pickles its argparse.Namespace under "args".
ALLOWED_GLOBALS = [argparse.Namespace]

# What a pickled NumPy uint32 array is rebuilt from (NumPy's own reduce), by exact object; a file NumPy 1
# wrote names the function numpy.core.multiarray._reconstruct. A training step's random states hold one
# (NumPy's MT19937 key).
_RECONSTRUCT = np.empty(0).__reduce__()[0]
NUMPY_UINT32_GLOBALS = [
    _RECONSTRUCT,
    (_RECONSTRUCT, "numpy.core.multiarray._reconstruct"),
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),
]

# What a refusal of a file that would run code advises, for a checkpoint.
ASK_FOR_WEIGHTS = "ask the file's author for its weights as a state dict or safetensors file"


_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since PyTorch 1.6
_PICKLE_PROTOCOL = b"\x80"  # the legacy torch.save format starts with a pickle protocol opcode
_IMAGE_MAGICS = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"II*\x00", b"MM\x00*", b"BM", b"RIFF")


def is_safetensors(head: bytes) -> bool:
    """Whether a file starting with ``head`` (at least 9 bytes) is a safetensors file: an 8-byte
    little-endian header length, then the JSON header."""
    return len(head) >= 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < 100_000_000


def describe_content(head: bytes) -> str:
    """What a file that starts with ``head`` looks like, for an error message."""
    if not head:
        return "an empty file"
    if head.startswith(b"version https://git-lfs"):
        return "a Git LFS pointer: fetch the real file with `git lfs pull`"
    if head.startswith(_IMAGE_MAGICS):
        return "an image"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return "binary data of an unknown format"
    if text.lstrip().startswith(("http://", "https://")):
        return "text: a URL (download the file it names)"
    if text.lstrip().startswith(("<!DOCTYPE", "<html", "<HTML")):
        return "an HTML page (a download that saved an error or login page?)"
    if any(line.split("#")[0].rstrip().endswith(":") or ": " in line for line in text.splitlines()[:5]):
        return "YAML or another text file"
    return "text"


def check_checkpoint_file(path: Path) -> None:
    """Raises ValueError naming ``path`` and what it looks like when it is not a PyTorch or
    safetensors checkpoint (text, a Git LFS pointer, an image, YAML, random bytes)."""
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith((_ZIP_MAGIC, _PICKLE_PROTOCOL)) or is_safetensors(head):
        return
    raise InputError(
        f"{path} is not a PyTorch/safetensors checkpoint (it looks like: {describe_content(head)})"
    )


def safe_torch_load(
    path: str | Path, extra_globals: Sequence[Any] = (), remedy: str = ASK_FOR_WEIGHTS
) -> Any:
    """``torch.load`` with ``weights_only=True`` on the CPU, allowing ``argparse.Namespace`` too
    (safetensors files are read as their tensors; ``mae.convert.sharded_checkpoint.read_checkpoint``
    reads a sharded checkpoint folder too). ``extra_globals``: more exact objects the file may name (as
    ``torch.serialization.safe_globals`` takes them, e.g. ``NUMPY_UINT32_GLOBALS``); ``remedy``: what the
    refusal of a file that would run code advises.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a checkpoint (saying what it looks like), it would run code or
            name other objects when unpickled (refused before anything runs), or it is truncated.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"checkpoint {path} does not exist")
    check_checkpoint_file(path)
    with open(path, "rb") as f:
        if is_safetensors(f.read(16)):
            return read_safetensors(path)
    try:
        with torch.serialization.safe_globals([*ALLOWED_GLOBALS, *extra_globals]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        named = re.findall(r"GLOBAL ([\w.]+)", str(err))
        what = f"it names {named[0]}" if named else "it holds objects that are not tensors or plain data"
        raise InputError(
            f"{path} would run code when loaded: {what}. Only tensors, plain containers and "
            f"argparse.Namespace are read from checkpoints; {remedy}."
        ) from None
    except (EOFError, RuntimeError, zipfile.BadZipFile, OSError, KeyError, IndexError) as err:
        raise InputError(
            f"could not read checkpoint {path}: truncated or corrupt ({type(err).__name__}: {err})"
        ) from err


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a ``.safetensors`` file (a format that cannot hold code)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"checkpoint {path} does not exist")
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError) as err:
        raise InputError(f"could not read safetensors file {path}: truncated or corrupt ({err})") from err
