"""Reading checkpoint files as untrusted input: tensors and plain data only, never arbitrary code."""

import argparse
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

# What real MAE checkpoints hold besides tensors and plain containers: the official training
# script pickles its argparse.Namespace under "args".
ALLOWED_GLOBALS = [argparse.Namespace]


def safe_torch_load(path: str | Path) -> Any:
    """``torch.load`` with ``weights_only=True`` on the CPU, allowing ``argparse.Namespace`` too.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file would run code or name other objects when unpickled (refused before
            anything runs), or it is truncated / not a PyTorch file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        named = re.findall(r"GLOBAL ([\w.]+)", str(err))
        what = f"it names {named[0]}" if named else "it holds objects that are not tensors or plain data"
        raise ValueError(
            f"refused to load {path}: {what}, and unpickling it could run code. Allowed are tensors, plain "
            f"containers and argparse.Namespace. Only if you trust the file's origin, load it yourself with "
            f"torch.load(weights_only=False) and re-save its state dict."
        ) from None
    except (EOFError, RuntimeError, zipfile.BadZipFile, OSError) as err:
        raise ValueError(f"could not read checkpoint {path}: truncated, corrupt or not a PyTorch file ({err})") from err


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a ``.safetensors`` file (a format that cannot hold code)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError) as err:
        raise ValueError(f"could not read safetensors file {path}: truncated or corrupt ({err})") from err
