"""The replay of a training step that went non-finite: from the capture folder a run kept of it
(``mae.training.callbacks.nonfinite.NonFiniteCapture`` writes it), the step is run again with a forward hook
on every module, and the first module whose output is non-finite is named.

The capture folder ``<run>/nonfinite/step_<N>/`` holds:

- ``batch.pt``: the batch of the step, as the training step received it (on the CPU);
- ``rng.pt``: the random states at the start of the step (torch CPU and CUDA, Python, NumPy: Lightning's,
  ``mae.compat.lightning.rng_states``), so the masks, dropout and mixup are drawn again as they were;
- ``state.ckpt``: the LightningModule's weights (its ``state_dict``), its hyperparameters and the
  optimizer states just before the step (the step is never applied: the loss is checked before the
  backward, the gradients before the optimizer step);
- ``config.yaml``: the run's config (when the run has one), and ``step.json``: what happened and how the
  step ran (module class, precision, device, attention kernel, what was found).

``mae replay <folder>`` runs ``replay_capture``; the capture callback runs ``replay_step`` on the step in
memory, where it happened. Capture folders are shared and edited, so nothing in one runs: its files are
read as tensors and plain data only, the module class is looked up in a table of training modules, and
hyperparameters that would build an object the file names are refused.
"""

import json
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.plugins import HalfPrecision, MixedPrecision, Precision
from torch import nn

from mae.compat.lightning import INSTANTIATOR_KEY, instantiator_allowed, restore_rng_states
from mae.convert.safe_load import NUMPY_UINT32_GLOBALS, safe_torch_load
from mae.errors import InputError, MissingFileError
from mae.training.runtime import set_attention_kernel
from mae.training.settings import settings_kwargs_v0_2

CAPTURE_FOLDER = "nonfinite"  # under the run folder
FILES = ("batch.pt", "rng.pt", "state.ckpt", "step.json")  # what every capture folder holds


@dataclass(frozen=True)
class Finding:
    """What a replay of a step found: ``module`` (its name in the LightningModule, e.g.
    ``model.blocks.1.mlp.fc2``, and ``kind``, its class) whose output was the first non-finite one;
    else ``parameters``, the parameters with non-finite gradients (a backward replay); ``loss``: whether
    the step's loss was non-finite."""

    module: str | None = None
    kind: str | None = None
    loss: bool = False
    parameters: tuple[str, ...] = ()
    located: bool = True  # False: not replayed where it was captured (a sharded run)

    def describe(self) -> str:
        if not self.located:
            return (
                "not located where it happened: under FSDP2 no process holds the whole model to replay the "
                "step (mae replay of the capture folder names the first non-finite module)"
            )
        if self.module is not None:
            return f"the first module whose output is non-finite is {self.module} ({self.kind})"
        if self.parameters:
            shown = ", ".join(self.parameters[:3]) + (", ..." if len(self.parameters) > 3 else "")
            return (
                f"every module's output is finite; {len(self.parameters)} parameter gradient(s) are not "
                f"({shown})"
            )
        if self.loss:
            return "every module's output is finite: the loss computed from them in training_step is not"
        return "the replayed step is finite (a non-deterministic kernel, or the data loading, differed)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "kind": self.kind,
            "loss": self.loss,
            "parameters": list(self.parameters),
            "located": self.located,
        }


class _FirstNonFinite(Exception):
    """Raised by the replay's forward hook at the first module whose output is non-finite."""

    def __init__(self, name: str, module: nn.Module) -> None:
        super().__init__(name)
        self.name, self.kind = name, type(module).__name__


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in a module's output (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _nonfinite(value: Any) -> bool:
    return any(t.is_floating_point() and not torch.isfinite(t).all() for t in _tensors(value))


@contextmanager
def _stop_at_first_nonfinite(module: pl.LightningModule) -> Iterator[None]:
    """A forward hook on every submodule of ``module`` that raises ``_FirstNonFinite`` at the first output
    that holds a NaN or an infinity (hooks run as each module's forward ends, so the innermost module that
    made it is the one named)."""

    def hook(name: str):
        def check(submodule: nn.Module, args: Any, output: Any) -> None:
            if _nonfinite(output):
                raise _FirstNonFinite(name, submodule)

        return check

    handles = [sub.register_forward_hook(hook(name)) for name, sub in module.named_modules() if name]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _loss_of(output: Any) -> torch.Tensor:
    """The loss of a ``training_step`` output (a tensor, or a dict with ``loss``)."""
    return output["loss"] if isinstance(output, dict) else output


def replay_step(
    module: pl.LightningModule,
    batch: Any,
    batch_idx: int,
    rng: dict[str, Any],
    precision: Precision,
    backward: bool,
) -> Finding:
    """Run ``module.training_step`` on ``batch`` again from the random states ``rng``, in ``precision``'s
    forward context, eagerly (a compiled network runs its plain modules), with a forward hook on every
    module; with ``backward``, also its backward from zeroed gradients. The training loss is neither
    checked nor logged (``module.replaying``). Returns what it found."""
    restore_rng_states(rng)
    module.replaying = True
    grad = torch.enable_grad() if backward else torch.no_grad()
    try:
        with _stop_at_first_nonfinite(module), precision.forward_context(), grad:
            with torch.compiler.set_stance("force_eager"):
                loss = _loss_of(module.training_step(batch, batch_idx))
            if backward and torch.isfinite(loss).item():
                module.zero_grad(set_to_none=True)
                loss.backward()
                return Finding(parameters=nonfinite_gradients(module))
    except _FirstNonFinite as found:
        return Finding(module=found.name, kind=found.kind, loss=True)
    finally:
        module.replaying = False
    return Finding(loss=not torch.isfinite(loss).item())


def nonfinite_gradients(module: nn.Module) -> tuple[str, ...]:
    """The names of ``module``'s parameters whose gradient holds a NaN or an infinity, in module order."""
    return tuple(
        name
        for name, p in module.named_parameters()
        if p.grad is not None and not torch.isfinite(p.grad).all()
    )


def _precision(name: str, device: str) -> Precision:
    """Lightning's precision plugin of the trainer setting ``name`` (its forward context is the run's)."""
    if name in ("16-mixed", "bf16-mixed"):
        return MixedPrecision(name, device)
    if name in ("16-true", "bf16-true"):
        return HalfPrecision(name)
    return Precision()


def read_capture(folder: Path) -> dict[str, Any]:
    """``step.json`` of a capture folder, after checking the folder holds every file of one.

    Raises:
        MissingFileError: the folder, or one of its files, does not exist.
        InputError: ``step.json`` is not a capture's record.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingFileError(
            f"{folder} is not a folder: give a capture folder <run>/{CAPTURE_FOLDER}/step_<N> of a run that "
            "stopped on a non-finite loss or gradient"
        )
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise MissingFileError(
            f"{folder} is not a complete capture folder: {', '.join(missing)} missing (a capture holds "
            "batch.pt, rng.pt, state.ckpt, step.json)"
        )
    try:
        record = json.loads((folder / "step.json").read_text())
    except ValueError as err:
        raise InputError(f"{folder / 'step.json'} is not a capture's record: {err}") from err
    needed = {"module_class", "batch_idx", "precision"}
    if not isinstance(record, dict) or not needed <= set(record):
        raise InputError(
            f"{folder / 'step.json'} is not a capture's record: it needs the keys {', '.join(sorted(needed))}"
        )
    return record


def module_class_of(folder: Path, record: dict[str, Any], modules: Mapping[str, type]) -> type:
    """The training module class ``step.json``'s ``module_class`` names, looked up in ``modules`` (class
    path -> class: the training modules a run captures), never imported as given.

    Raises:
        InputError: the name is not one of ``modules``, naming it and the allowed names.
    """
    name = record["module_class"]
    if not isinstance(name, str) or name not in modules:
        raise InputError(
            f"{Path(folder) / 'step.json'}: module_class {name!r} is not one of the training modules a run "
            f"captures ({', '.join(sorted(modules))}); a capture folder names the module of the run that "
            "wrote it"
        )
    return modules[name]


def load_capture_file(path: Path) -> Any:
    """A capture folder's ``batch.pt``, ``rng.pt`` or ``state.ckpt``, on the CPU, as tensors and plain
    data only (``mae.convert.safe_load.safe_torch_load``, with NumPy's random state).

    Raises:
        InputError: naming the file, when it would run code when loaded, or is damaged (truncated or
            corrupt).
    """
    return safe_torch_load(path, NUMPY_UINT32_GLOBALS, remedy=_REWRITE)


_REWRITE = "a capture holds only those: replay a capture folder a run wrote"
_CLASS_SPEC_KEYS = ("class_path", "_class_path")  # what Lightning's instantiator would import and build


def check_hyperparameters(path: Path, hparams: Any, at: str = "hyper_parameters") -> None:
    """Refuse the hyperparameters ``hparams`` of the capture's ``path`` (``state.ckpt``) that would make
    rebuilding the module import or build an object the file names: a ``class_path`` anywhere (Lightning's
    instantiator builds one where a setting takes any value), an instantiator Lightning does not trust.

    Raises:
        InputError: naming the file, the key and the value.
    """
    if isinstance(hparams, dict):
        for key, value in hparams.items():
            where = f"{at}.{key}"
            if key in _CLASS_SPEC_KEYS or (key == INSTANTIATOR_KEY and not instantiator_allowed(value)):
                raise InputError(
                    f"{path} would run code when the module is rebuilt: {where} names {value!r}; a capture's "
                    "hyperparameters hold only the module's own settings"
                )
            check_hyperparameters(path, value, where)
    elif isinstance(hparams, list | tuple):
        for index, value in enumerate(hparams):
            check_hyperparameters(path, value, f"{at}.{index}")


def rebuild_module(module_class: type, path: Path, state: dict[str, Any], device: str) -> pl.LightningModule:
    """The ``module_class`` a capture's ``path`` (``state.ckpt``, already read as ``state`` and checked)
    holds, on ``device``: read again by Lightning, tensors and plain data only. A capture written before a
    settings rename (0.4.0's ``norm_pix_loss``) is rebuilt under the new names: Lightning would drop the
    old key without a word, and ``norm_pix_loss: false`` would come back as the default target."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the hyperparameters' own notes (a missing init checkpoint, ...)
        return module_class.load_from_checkpoint(
            path,
            map_location=device,
            weights_only=True,
            **settings_kwargs_v0_2(state.get("hyper_parameters") or {}),
        )


def replay_capture(folder: Path, modules: Mapping[str, type]) -> tuple[Finding, dict[str, Any]]:
    """Load a capture folder (module class, weights, batch, random states) and replay its step
    (``replay_step``, with the backward when a gradient went non-finite), on the device it ran on when
    there is one here, else on the CPU. ``modules``: the training modules ``step.json`` may name (class
    path -> class; ``mae replay``'s: one per training command). Every file is read as tensors and plain
    data only, and the module class is looked up, never imported from the file's text. Returns (what it
    found, the capture's ``step.json``).

    Raises:
        MissingFileError, InputError: naming the file that is missing, damaged, would run code, or names a
            module class that is not one of ``modules``.
    """
    folder = Path(folder)
    record = read_capture(folder)
    module_class = module_class_of(folder, record, modules)
    state = load_capture_file(folder / "state.ckpt")
    if not isinstance(state, dict) or not isinstance(state.get("state_dict"), dict):
        raise InputError(f"{folder / 'state.ckpt'} is not a capture's state: it holds no state_dict")
    check_hyperparameters(folder / "state.ckpt", state.get("hyper_parameters", {}))
    batch = load_capture_file(folder / "batch.pt")
    rng = load_capture_file(folder / "rng.pt")
    device = record.get("device", "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        warnings.warn(
            "the step ran on CUDA; replaying it on the CPU (its masks and dropout differ)", stacklevel=2
        )
        device = "cpu"
    module = rebuild_module(module_class, folder / "state.ckpt", state, device)
    if record.get("img_size") and hasattr(module, "at_img_size"):
        module.model.set_img_size(tuple(record["img_size"]))  # the phase the step ran in
    if record.get("attention"):
        set_attention_kernel(module.network, record["attention"])
    precision = _precision(record["precision"], device)
    module = precision.convert_module(module).train()
    batch = move_data_to_device(batch, device)
    if device != "cuda":
        rng.pop("torch.cuda", None)
    finding = replay_step(
        module, batch, record["batch_idx"], rng, precision, record.get("reason") == "gradient"
    )
    return finding, record
