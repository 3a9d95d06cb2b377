"""Callbacks the smoke check's ``mae`` runs train with (by ``class_path``), and readers of what they write.

``RunRecord`` appends JSON lines (start, end, saves, the exception that ended a run), ``MidStepPause``
marks the moment to send SIGTERM, ``StepTimer`` times synchronised training steps.
"""

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.distributed.tensor import DTensor


def write_json(path: Path, data: Any) -> None:
    """``data`` as JSON at ``path``, written whole (a temporary file renamed), so a reader never sees half."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """The JSON at ``path``, or None while it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_events(path: Path) -> list[dict]:
    """The JSON lines ``RunRecord`` appended to ``path``."""
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def state_digest(state: dict[str, Any]) -> dict[str, str]:
    """{name: sha256 of dtype, shape and bytes} of every tensor of a state dict (no arithmetic on them)."""
    out = {}
    for name in sorted(state):
        value = state[name]
        if isinstance(value, torch.Tensor):
            data = value.detach().cpu().contiguous().reshape(-1)
            digest = hashlib.sha256(f"{data.dtype}{tuple(value.shape)}".encode())
            digest.update(data.view(torch.uint8).numpy().tobytes())
            out[name] = digest.hexdigest()[:20]
    return out


def differing(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The tensor names whose digests differ between two ``state_digest`` results."""
    return sorted(name for name in set(a) | set(b) if a.get(name) != b.get(name))


class RunRecord(pl.Callback):
    """Appends JSON lines to ``path``: the step, device, strategy and (with ``digest``) the weights' digests
    at the start and end of training (the weights as the strategy saves them, FSDP2's shards gathered
    whole), every checkpoint save's step, and the exception that ended a run."""

    def __init__(self, path: str, digest: bool = False) -> None:
        self.path, self.digest, self.batches = path, digest, 0

    def _write(self, trainer: pl.Trainer, event: str, **more: Any) -> None:
        state = (
            trainer.strategy.lightning_module_state_dict()
            if self.digest and event.startswith("train")
            else None
        )
        if state is not None:  # FSDP2's sharded state: whole tensors (a collective: on every process)
            state = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}
        if not trainer.is_global_zero:
            return
        record = {
            "event": event,
            "step": trainer.global_step,
            "pid": os.getpid(),
            "time": time.time(),
            **more,
        }
        if state is not None:
            record["digest"] = state_digest(state)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.batches = 0
        strategy = type(trainer.strategy).__name__
        self._write(
            trainer,
            "train_start",
            device=str(trainer.strategy.root_device),
            strategy=strategy,
            precision=str(trainer.precision),
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict
    ) -> None:
        self._write(trainer, "save")

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._write(trainer, "exception", type=type(exception).__name__, batches=self.batches)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(trainer, "train_end", batches=self.batches)


class MidStepPause(pl.Callback):
    """In training step ``step``, after the forward pass and before the backward (the forward's kernels
    queued on the device), writes ``marker`` (JSON: step, pid, device) and sleeps ``seconds``: the moment the
    smoke check sends SIGTERM."""

    def __init__(self, step: int, marker: str, seconds: float = 3.0) -> None:
        self.step, self.marker, self.seconds, self.done = step, marker, seconds, False

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        if self.done or trainer.global_step != self.step:
            return
        self.done = True
        write_json(
            Path(self.marker), {"step": trainer.global_step, "pid": os.getpid(), "device": str(loss.device)}
        )
        time.sleep(self.seconds)


class StepTimer(pl.Callback):
    """Wall time of training steps after ``warmup`` steps, and within them the time the data module's
    ``on_before_batch_transfer`` takes (where ``data.decode_on: gpu`` decodes the batch) and the time between
    one step's end and the next one's start (loader wait, that hook, the copy to the device). The device is
    synchronised at each step's end and around the hook, so the shares are those of a synchronised step.
    Writes ``path`` (JSON) when training ends."""

    def __init__(self, path: str, warmup: int = 10) -> None:
        self.path, self.warmup = path, warmup
        self.ends: list[float] = []
        self.images: list[int] = []
        self.decode: list[float] = []
        self.data: list[float] = []
        self._decode = 0.0
        self._started = 0.0

    def _sync(self, trainer: pl.Trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        data = trainer.datamodule
        hook = data.on_before_batch_transfer

        def timed(batch: Any, dataloader_idx: int) -> Any:
            if not trainer.training:
                return hook(batch, dataloader_idx)
            self._sync(trainer)
            start = time.perf_counter()
            out = hook(batch, dataloader_idx)
            self._sync(trainer)
            self._decode += time.perf_counter() - start
            return out

        data.on_before_batch_transfer = timed

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._sync(trainer)
        now = time.perf_counter()
        self.data.append(self._started - self.ends[-1] if self.ends else 0.0)
        self.ends.append(now)
        self.images.append(len(batch[0]))
        self.decode.append(self._decode)
        self._decode = 0.0

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            write_json(Path(self.path), self._timing(trainer))

    def _timing(self, trainer: pl.Trainer) -> dict:
        w = min(self.warmup, len(self.ends) - 1)
        if w < 1:
            return {"error": f"only {len(self.ends)} steps: nothing to time after a warm-up"}
        seconds = self.ends[-1] - self.ends[w - 1]
        decode, data, images = sum(self.decode[w:]), sum(self.data[w:]), sum(self.images[w:])
        return {
            "steps_timed": len(self.ends) - w,
            "warmup_steps": w,
            "seconds": seconds,
            "images": images,
            "images_per_s": images / seconds,
            "step_ms": 1000 * seconds / (len(self.ends) - w),
            "decode_hook_s": decode,
            "decode_share": decode / seconds,
            "data_wait_s": data,
            "data_wait_share": data / seconds,
            "device": str(trainer.strategy.root_device),
            "precision": str(trainer.precision),
            "synchronised": True,
        }
