"""The GPU smoke check of issue 44: every GPU-only path of the project run once, briefly, on one GPU, each
part under its own time limit, with a JSON file of results per part (``bash benchmarks/gpu_smoke.sh``).

Parts (``PARTS``; on the GPU / in the dry run):

1. ``throughput``: the ViT-B/16 bf16 training step, ours with the default settings against Hugging Face's
   ViTMAE variants, interleaved, 2 rounds (``benchmarks/throughput.py``; dry run: the CIFAR-size model at
   batch 2, torch.compile turned off).
2. ``train_shards``: 300 steps of ``python train.py`` (ViT-B/16, batch 128) from local litdata shards that
   ``python -m mae.data.shard`` wrote from a generated folder of JPEGs, with ``data.decode_on: gpu``:
   images/s and the decode's share of the step, plus the stand-alone nvJPEG rate
   (``benchmarks/dataloader.py``'s ``gpu_decode_rates``); dry run: a tiny model, decoding in the loader.
3. ``decoders``: every decoder switch (partial reconstruction, the cross decoder, low resolution, the fast
   recipe) for 50 timed steps each on ViT-B/16 (``benchmarks/time_to_quality.py --throughput-only``).
4. ``fsdp``: ``python train.py`` with ``trainer.strategy: fsdp`` on one GPU for a few steps, then
   ``--ckpt_path`` resume: the weights after the reload equal those saved, and the run continues from the
   saved step (dry run: the default strategy, since Lightning's FSDP needs CUDA).
5. ``detect``: ``python detect.py`` with the COCO ViTDet recipe's model (a random ViT-B encoder) in bf16 for
   30 steps on the built-in digit scenes.
6. ``onnx``: an encoder trained on the GPU, exported to ONNX (``mae.apps.onnx_encoder.export_onnx``, which
   checks it with onnxruntime) and compared with the encoder run on the GPU.
7. ``sigterm``: SIGTERM in the middle of a CUDA training step of ``python train.py`` (between forward and
   backward), then ``--ckpt_path last``: exit status 143, a checkpoint at that step, and the resumed run
   continues from it.

    python benchmarks/gpu_smoke.py run --out gpu_smoke_results              # every part (what the .sh runs)
    python benchmarks/gpu_smoke.py run --dry-run --out /tmp/smoke           # every part on the CPU, tiny
    python benchmarks/gpu_smoke.py sigterm --out gpu_smoke_results          # one part, no time limit

``run`` imports torch, Lightning and the project once and forks a child per part (its own process group,
killed with everything it started when the part's time limit passes: status "timeout"); a part that does
not fit in what is left of ``--deadline`` is "skipped". The entry points a part runs (``train.py``,
``detect.py``, ``python -m mae.data.shard``) are forked children of the part running the script as
``__main__``, as a fresh ``python train.py`` would (``GPU_SMOKE_FRESH=1``: real fresh interpreters for
parts and entry points, slower). So no process that forks has initialised CUDA or run a CPU torch op
(GNU OpenMP hangs in a child forked after one). Each part writes ``OUT/<part>.json`` (``status``,
``seconds``, ``results``, ``notes``, ``error``) and ``OUT/<part>.log``; ``run`` keeps ``OUT/summary.json``.
Environment: ``GPU_SMOKE_LIMIT_<PART>`` / ``GPU_SMOKE_MIN_<PART>`` (seconds) replace a part's time limit /
the least time it is started with (e.g. ``GPU_SMOKE_LIMIT_SIGTERM=3`` to see a timeout).
"""

import os

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # a CUDA check before a fork must not initialise CUDA

import argparse  # noqa: E402
import atexit  # noqa: E402
import csv  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import runpy  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # benchmarks.* and mae, also in the entry points run as __main__

PARTS = ("throughput", "train_shards", "decoders", "fsdp", "detect", "onnx", "sigterm")
# part: (time limit on the GPU, least time left to start it), seconds; the dry run allows DRY_LIMIT each.
LIMITS = {
    "throughput": (150, 60),
    "train_shards": (150, 60),
    "decoders": (90, 40),
    "fsdp": (100, 40),
    "detect": (110, 45),
    "onnx": (80, 30),
    "sigterm": (100, 40),
}
DRY_LIMIT, DRY_MIN = 240, 5
KILL_GRACE_S = 5  # after SIGTERM to a part's process group, SIGKILL
STATUSES = ("ok", "failed", "timeout", "skipped")
# The smallest trainable model (tests/helpers.py's TINY_KWARGS): every dry-run training.
TINY_KWARGS = dict(embed_dim=32, depth=1, num_heads=2, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2)
CSV_LOGGER = "lightning.pytorch.loggers.CSVLogger"


class SmokeFailure(Exception):
    """A check of a part failed; ``results`` are what it had measured."""

    def __init__(self, message: str, results: dict) -> None:
        super().__init__(message)
        self.results = results


# ---------------------------------------------------------------- JSON files


def write_json(path: Path, data: Any) -> None:
    """``data`` as JSON at ``path``, written whole (a temporary file renamed), so a reader never sees half."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_events(path: Path) -> list[dict]:
    """The JSON lines ``RunRecord`` appended to ``path``."""
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def tail(path: Path, chars: int = 3000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# ---------------------------------------------------------------- processes


@dataclass
class Child:
    """A started process: forked (``popen`` None) or a fresh interpreter. ``pgid``: its process group."""

    pid: int
    pgid: int
    popen: subprocess.Popen | None = None
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            if self.popen is not None:
                self.returncode = self.popen.poll()
            else:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)  # minus the signal's number when killed
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None when it still runs after ``timeout`` seconds."""
        deadline = time.monotonic() + max(0.0, timeout)
        while self.poll() is None:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        return self.returncode

    def kill(self) -> None:
        """SIGTERM to this process alone (an entry point shares its part's group), SIGKILL after the grace."""
        for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 10)):
            if self.poll() is None:
                try:
                    os.kill(self.pid, sig)
                except ProcessLookupError:
                    pass
                self.wait(grace)

    def kill_group(self) -> None:
        """SIGTERM to the process group (the child and whatever it started), SIGKILL after the grace."""
        for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            self.wait(grace)
        if self.poll() is None:
            raise RuntimeError(f"process {self.pid} survived SIGKILL")


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs. A killed grandchild is re-parented to PID 1, which
    may reap it late: its zombie still answers ``killpg(pgid, 0)`` but runs nothing, so it is not counted."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


def _redirect_output(log: Path) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _in_child(log: Path, new_group: bool) -> None:
    """The first things a forked child does: a process group of its own (a part) or its parent's (an entry
    point, killed with the part), default signal handling, output to ``log``."""
    if new_group:
        os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _redirect_output(log)


def _exit_child(code: int) -> None:
    atexit._run_exitfuncs()  # a forked child leaves through os._exit, which skips them; an interpreter runs them
    _flush()
    os._exit(code)


def _exit_status(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _run_as_main(command: list[str]) -> int:
    """``python *command`` in this process: a script or ``-m module`` as ``__main__``; its exit status."""
    os.chdir(REPO)
    try:
        if command[0] == "-m":
            sys.argv = [command[1], *command[2:]]
            sys.modules.pop(command[1], None)
            runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(command)
            runpy.run_path(str(REPO / command[0]), run_name="__main__")
    except SystemExit as exit_:
        return _exit_status(exit_.code)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def fresh_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def start_entry(command: list[str], log: Path, fresh: bool) -> Child:
    """``python *command`` (``train.py ...``, ``-m mae.data.shard ...``) with its output in ``log``, in the
    caller's process group: a forked child running it as ``__main__``, or with ``fresh`` a new interpreter."""
    print(f"$ python {' '.join(command)}   (output: {log.name})", flush=True)
    if fresh:
        with open(log, "ab") as out:
            popen = subprocess.Popen([sys.executable, *command], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=fresh_env())  # fmt: skip
        return Child(popen.pid, os.getpgid(0), popen)
    _flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            _in_child(log, new_group=False)
            code = _run_as_main(command)
        finally:
            _exit_child(code)
    return Child(pid, os.getpgid(0))


# ---------------------------------------------------------------- callbacks the entry points run with


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
    return sorted(name for name in set(a) | set(b) if a.get(name) != b.get(name))


class RunRecord(pl.Callback):
    """Appends JSON lines to ``path``: the step, device, strategy and (with ``digest``) the weights' digests
    at the start and end of training (the weights as the strategy saves them: FSDP's full state dict), every
    checkpoint save's step, and the exception that ended a run."""

    def __init__(self, path: str, digest: bool = False) -> None:
        self.path, self.digest, self.batches = path, digest, 0

    def _write(self, trainer: pl.Trainer, event: str, **more: Any) -> None:
        state = trainer.strategy.lightning_module_state_dict() if self.digest and event.startswith("train") else None
        if not trainer.is_global_zero:
            return
        record = {"event": event, "step": trainer.global_step, "pid": os.getpid(), "time": time.time(), **more}
        if state is not None:
            record["digest"] = state_digest(state)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.batches = 0
        self._write(trainer, "train_start", device=str(trainer.strategy.root_device),
                    strategy=type(trainer.strategy).__name__, precision=str(trainer.precision))  # fmt: skip

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        self._write(trainer, "save")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._write(trainer, "exception", type=type(exception).__name__, batches=self.batches)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(trainer, "train_end", batches=self.batches)


class MidStepPause(pl.Callback):
    """In training step ``step``, after the forward pass and before the backward (the forward's kernels
    queued on the device), writes ``marker`` (JSON: step, pid, device) and sleeps ``seconds``: the moment a
    smoke check sends SIGTERM."""

    def __init__(self, step: int, marker: str, seconds: float = 3.0) -> None:
        self.step, self.marker, self.seconds, self.done = step, marker, seconds, False

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        if self.done or trainer.global_step != self.step:
            return
        self.done = True
        write_json(Path(self.marker), {"step": trainer.global_step, "pid": os.getpid(), "device": str(loss.device)})
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
        if self.ends:
            self.data.append(self._started - self.ends[-1])
        else:
            self.data.append(0.0)
        self.ends.append(now)
        self.images.append(len(batch[0]))
        self.decode.append(self._decode)
        self._decode = 0.0

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        w = min(self.warmup, len(self.ends) - 1)
        if w < 1:
            result = {"error": f"only {len(self.ends)} steps: nothing to time after a warm-up"}
        else:
            seconds = self.ends[-1] - self.ends[w - 1]
            decode, data = sum(self.decode[w:]), sum(self.data[w:])
            images = sum(self.images[w:])
            result = {"steps_timed": len(self.ends) - w, "warmup_steps": w, "seconds": seconds, "images": images,
                      "images_per_s": images / seconds, "step_ms": 1000 * seconds / (len(self.ends) - w),
                      "decode_hook_s": decode, "decode_share": decode / seconds, "data_wait_s": data,
                      "data_wait_share": data / seconds, "device": str(trainer.strategy.root_device),
                      "precision": str(trainer.precision), "synchronised": True}  # fmt: skip
        if trainer.is_global_zero:
            write_json(Path(self.path), result)


# ---------------------------------------------------------------- what a part works with


@dataclass
class Context:
    part: str
    out: Path
    dry_run: bool
    fresh: bool
    deadline: float  # time.time() by which the part must be done (the driver kills it then)
    notes: list[str] = field(default_factory=list)

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    @property
    def accelerator(self) -> str:
        return "cpu" if self.dry_run else "gpu"

    @property
    def precision(self) -> str:
        return "32-true" if self.dry_run else "bf16-mixed"

    @property
    def work(self) -> Path:
        folder = self.out / "work" / self.part
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def fresh_work(self) -> Path:
        shutil.rmtree(self.out / "work" / self.part, ignore_errors=True)
        return self.work

    def log(self, name: str) -> Path:
        return self.out / f"{self.part}.{name}.log"

    def remaining(self) -> float:
        return max(1.0, self.deadline - time.time())

    def note(self, text: str) -> None:
        print(f"note: {text}", flush=True)
        self.notes.append(text)

    def entry(self, name: str, *command: str) -> tuple[int, str]:
        """Run ``python *command`` to its end; (exit status, its output's tail)."""
        log = self.log(name)
        child = start_entry(list(command), log, self.fresh)
        code = child.wait(self.remaining() + 60)  # the driver's limit ends the part first
        if code is None:
            child.kill()
            code = child.returncode
        print(f"  exit status {code}", flush=True)
        return code, tail(log)

    def write_config(self, name: str, config: dict) -> Path:
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path


def default_job_model(ctx: Context) -> dict:
    """The default job's ``model`` section (configs/pretrain/default.yaml; in the dry run its tiny version)
    without the lr warm-up, which must be shorter than these short runs."""
    if ctx.dry_run:
        return {"model": "mae_vit_tiny_patch4", "model_kwargs": dict(TINY_KWARGS), "warmup_epochs": 0}
    model = yaml.safe_load((REPO / "configs" / "pretrain" / "default.yaml").read_text())["model"]
    return {**model, "warmup_epochs": 0}


def pretrain_config(ctx: Context, name: str, model: dict, data: dict, callbacks: list[dict], **trainer: Any) -> dict:
    """A ``train.py`` config: no validation, figures or kNN; CSV metrics under the part's work folder."""
    return {
        "seed_everything": 0,
        "model": model,
        "data": data,
        "trainer": {"accelerator": ctx.accelerator, "devices": 1, "precision": ctx.precision,
                    "enable_progress_bar": False, "log_every_n_steps": 5, "limit_val_batches": 0,
                    "num_sanity_val_steps": 0,
                    "logger": {"class_path": CSV_LOGGER,
                               "init_args": {"save_dir": str(ctx.work / "runs"), "name": name}},
                    "callbacks": callbacks, **trainer},
        "reconstruction": {"every_n_epochs": 0},
        "knn": {"every_n_epochs": 0},
    }  # fmt: skip


def digits(ctx: Context, img_size: int, batch_size: int) -> dict:
    return {"class_path": "mae.data.DigitsDataModule",
            "init_args": {"img_size": img_size, "batch_size": batch_size, "num_workers": 0}}  # fmt: skip


def callback(cls: type, **init_args: Any) -> dict:
    return {"class_path": f"benchmarks.gpu_smoke.{cls.__name__}", "init_args": init_args}


def check(results: dict, failures: list[str]) -> dict:
    """``results``, or SmokeFailure naming every failed check."""
    results["checks_failed"] = failures
    if failures:
        raise SmokeFailure("; ".join(failures), results)
    return results


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.csv"
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------- the parts


def part_throughput(ctx: Context) -> dict:
    """Ours (default settings) vs Hugging Face's ViTMAE variants, one training step, interleaved."""
    from benchmarks import throughput

    if ctx.dry_run:
        torch._dynamo.config.disable = True  # compiling would take a minute on 2 cores: "ours default" runs eagerly
        ctx.note("dry run: the CIFAR-size model at batch 2 on the CPU; torch.compile disabled (eager)")
        argv = ["--configs", "cifar", "--batch-size", "2", "--warmup", "0", "--steps", "1"]
    else:
        argv = ["--configs", "base224", "--batch-size", "256", "--warmup", "2", "--steps", "5"]
    argv += ["--device", ctx.device, "--variants", "peers", "default", "--rounds", "2", "--no-memory"]
    print("benchmarks/throughput.py " + " ".join(argv), flush=True)
    rows = throughput.main(argv)
    ours = next(r for r in rows if r["contender"].startswith("ours default"))
    hf = max((r for r in rows if r["impl"] == "hf"), key=lambda r: r["img_s"])
    results = {"argv": argv, "config": rows[0]["config"], "batch_size": rows[0]["batch_size"],
               "ours_default": {"contender": ours["contender"], "img_s": ours["img_s"],
                                "memory_mib": ours.get("memory_mib")},
               "hf_best": {"contender": hf["contender"], "img_s": hf["img_s"], "memory_mib": hf.get("memory_mib")},
               "ours_vs_hf_best": ours["img_s"] / hf["img_s"], "rows": rows}  # fmt: skip
    failures = [f"{r['contender']}: {r['img_s']} img/s" for r in rows if not (r["img_s"] > 0)]
    return check(results, failures)


def make_jpeg_folder(ctx: Context) -> tuple[Path, int]:
    """``work/images/train/<class>/*.jpg``: photo-like JPEGs (benchmarks/dataloader.py's); on the GPU 256
    distinct 500x375 images, each hard-linked 16 times (4,096 files: 32 steps per epoch at batch 128)."""
    from benchmarks.dataloader import write_photos

    images = ctx.work / "images"
    if ctx.dry_run:
        write_photos(images / "train", 2, 8, size=(96, 72))
        return images, 16
    unique = write_photos(ctx.work / "unique" / "train", 8, 32)
    count = 0
    for path in sorted(unique.rglob("*.jpg")):
        folder = images / "train" / path.parent.name
        folder.mkdir(parents=True, exist_ok=True)
        for copy in range(16):
            target = folder / f"{path.stem}_{copy:02d}.jpg"
            try:
                os.link(path, target)
            except OSError:
                shutil.copyfile(path, target)
            count += 1
    return images, count


def part_train_shards(ctx: Context) -> dict:
    """``python train.py`` from local shards with ``data.decode_on: gpu``: images/s and the decode's share."""
    ctx.fresh_work()
    images, count = make_jpeg_folder(ctx)
    shards = ctx.work / "shards"
    code, out = ctx.entry("shard", "-m", "mae.data.shard", str(images), "--out", str(shards), "--val-split", "",
                          "--workers", "1" if ctx.dry_run else "8", "--start-method", "fork")  # fmt: skip
    if code != 0:
        raise SmokeFailure(f"python -m mae.data.shard exited with {code}: {out[-1500:]}", {"images": count})
    if ctx.dry_run:
        ctx.note("dry run: data.decode_on cpu (decode_on gpu needs CUDA), the tiny model at 32 px, batch 4, 8 steps")
        model = default_job_model(ctx)
        img_size, batch, steps, warmup, workers, decode_on = 32, 4, 8, 2, 0, "cpu"
    else:
        model = {"model": "mae_vit_base_patch16", "norm_pix_loss": True, "warmup_epochs": 1}
        img_size, batch, steps, warmup, workers, decode_on = 224, 128, 300, 30, 6, "gpu"
    timing = ctx.work / "step_timer.json"
    data = {"class_path": "mae.data.StreamingDataModule",
            "init_args": {"root": str(shards), "val_split": None, "img_size": img_size, "batch_size": batch,
                          "num_workers": workers, "persistent_workers": workers > 0, "decode_on": decode_on,
                          "cache_dir": str(ctx.work / "cache")}}  # fmt: skip
    callbacks = [
        callback(StepTimer, path=str(timing), warmup=warmup),
        callback(RunRecord, path=str(ctx.work / "run.jsonl")),
    ]
    config = pretrain_config(ctx, "shards", model, data, callbacks, max_steps=steps, max_epochs=-1)
    config["checkpoint"] = {"save_last": False, "save_top_k": 0, "every_n_epochs": 0}
    code, out = ctx.entry("train", "train.py", "--config", str(ctx.write_config("train", config)))
    timed = read_json(timing) or {}
    events = read_events(ctx.work / "run.jsonl")
    end = next((e for e in events if e["event"] == "train_end"), {})
    results = {"images_generated": count, "model": model["model"], "img_size": img_size, "batch_size": batch,
               "loader_workers": workers, "decode_on": decode_on,
               "decode_where": "training process, nvJPEG (data.decode_on: gpu)" if decode_on == "gpu"
               else "loader (CPU decode; counted in data_wait_share)",
               "steps": end.get("step"), "train_exit_status": code, **timed}  # fmt: skip
    failures = []
    if code != 0:
        failures.append(f"train.py exited with {code}: {out[-1500:]}")
    if end.get("step") != steps:
        failures.append(f"trained {end.get('step')} steps, not {steps}")
    if "images_per_s" not in timed:
        failures.append(f"no step timing ({timed.get('error', 'StepTimer wrote nothing')})")
    elif not timed["device"].startswith(ctx.device):
        failures.append(f"trained on {timed['device']}, not {ctx.device}")
    if failures:
        return check(results, failures)
    # the stand-alone rates on the same shards: a worker reading bytes, and batch decode + crop on the device
    from benchmarks.dataloader import gpu_decode_rates

    rates_args = argparse.Namespace(batch_size=batch, rounds=1 if ctx.dry_run else 2, batches=2 if ctx.dry_run else 8)
    results["standalone"] = gpu_decode_rates(shards, img_size, ctx.device, rates_args)
    results["standalone"]["decode_device"] = ctx.device
    return check(results, [])


def part_decoders(ctx: Context) -> dict:
    """Every decoder switch's training-step throughput (benchmarks/time_to_quality.py --throughput-only)."""
    from benchmarks import time_to_quality

    if ctx.dry_run:
        ctx.note("dry run: the tiny model at 32 px, batch 2, 1 timed step per round")
        argv = ["--model", "mae_vit_tiny_patch4", "--model-kwargs", json.dumps(TINY_KWARGS), "--img-size", "32",
                "--batch-size", "2", "--warmup", "1", "--steps", "1"]  # fmt: skip
    else:
        argv = ["--model", "mae_vit_base_patch16", "--img-size", "224", "--batch-size", "256", "--warmup", "3",
                "--steps", "25"]  # fmt: skip
    argv = ["--throughput-only", "--device", ctx.device, "--rounds", "2", *argv]
    print("benchmarks/time_to_quality.py " + " ".join(argv), flush=True)
    rows = time_to_quality.main(argv)
    steps = int(argv[argv.index("--steps") + 1]) * 2
    results = {"argv": argv, "timed_steps_per_variant": steps, "rows": rows,
               "img_s": {r["variant"]: r["img_s"] for r in rows}}  # fmt: skip
    stepwise = {name for name, variant in time_to_quality.VARIANTS.items() if not variant.phases}  # one step size
    missing = sorted(stepwise - set(results["img_s"]))
    failures = [f"variants not measured: {missing}"] if missing else []
    failures += [f"{name}: {v} img/s" for name, v in results["img_s"].items() if not (v > 0)]
    return check(results, failures)


def part_fsdp(ctx: Context) -> dict:
    """``train.py`` with FSDP for a few steps, then resumed from its checkpoint: equal weights, same step."""
    ctx.fresh_work()
    first, total = (3, 5) if ctx.dry_run else (6, 10)
    strategy = "auto" if ctx.dry_run else "fsdp"
    if ctx.dry_run:
        ctx.note("dry run: Lightning's FSDP needs CUDA; the same save / load / resume check with the default strategy")
    record = ctx.work / "run.jsonl"
    config = pretrain_config(ctx, "fsdp", default_job_model(ctx), digits(ctx, 32, 8 if ctx.dry_run else 64),
                             [callback(RunRecord, path=str(record), digest=True)], max_steps=first, max_epochs=-1,
                             strategy=strategy)  # fmt: skip
    config["checkpoint"] = {"dirpath": str(ctx.work / "ckpts"), "save_last": True, "save_top_k": 0}
    path = ctx.write_config("fsdp", config)
    code1, out1 = ctx.entry("first", "train.py", "--config", str(path))
    last = ctx.work / "ckpts" / "last.ckpt"
    saved = ctx.work / "saved_first.ckpt"
    if last.exists():
        shutil.copyfile(last, saved)  # the resumed run overwrites last.ckpt
    code2, out2 = (None, "")
    if code1 == 0 and last.exists():
        code2, out2 = ctx.entry("resume", "train.py", "--config", str(path), "--trainer.max_steps", str(total),
                                "--ckpt_path", str(last))  # fmt: skip
    events = read_events(record)
    runs = [e for e in events if e["event"] in ("train_start", "train_end")]
    end1 = next((e for e in runs if e["event"] == "train_end"), None)
    start2 = next((e for e in runs[1:] if e["event"] == "train_start"), None)
    end2 = next((e for e in runs[::-1] if e["event"] == "train_end" and e is not end1), None)
    results = {"strategy": strategy, "precision": ctx.precision, "first_run_steps": first, "resumed_to": total,
               "exit_status": [code1, code2], "trained_on": (runs[0] if runs else {}).get("device"),
               "strategy_class": (runs[0] if runs else {}).get("strategy")}  # fmt: skip
    failures = []
    if code1 != 0 or not last.exists():
        failures.append(f"first run: exit status {code1}, last.ckpt {'found' if last.exists() else 'missing'}: "
                        f"{out1[-1500:]}")  # fmt: skip
    elif code2 != 0:
        failures.append(f"resumed run exited with {code2}: {out2[-1500:]}")
    if failures or not (end1 and start2 and end2):
        return check(results, failures or [f"the runs' records are incomplete: {[e['event'] for e in events]}"])
    file_state = torch.load(saved, map_location="cpu", weights_only=True, mmap=True)
    file_digest = state_digest(file_state["state_dict"])
    results.update(saved_step=file_state["global_step"], first_run_end_step=end1["step"],
                   resumed_from_step=start2["step"], resumed_batches=end2["batches"], final_step=end2["step"],
                   tensors=len(file_digest), checkpoint_mb=saved.stat().st_size / 2**20,
                   weights_equal_after_reload=not differing(end1["digest"], start2["digest"]),
                   checkpoint_equals_trained=not differing(end1["digest"], file_digest))  # fmt: skip
    expected = "SingleDeviceStrategy" if ctx.dry_run else "FSDPStrategy"
    if results["strategy_class"] != expected or not str(results["trained_on"]).startswith(ctx.device):
        failures.append(
            f"ran with {results['strategy_class']} on {results['trained_on']}, not {expected} on {ctx.device}"
        )
    if differing(end1["digest"], file_digest):
        failures.append(f"last.ckpt differs from the trained weights: {differing(end1['digest'], file_digest)[:5]}")
    if differing(end1["digest"], start2["digest"]):
        failures.append(f"weights after the reload differ: {differing(end1['digest'], start2['digest'])[:5]}")
    if not (file_state["global_step"] == end1["step"] == start2["step"] == first):
        failures.append(f"steps: saved {file_state['global_step']}, first run ended at {end1['step']}, resumed at "
                        f"{start2['step']} (expected {first})")  # fmt: skip
    if end2["step"] != total or end2["batches"] != total - first:
        failures.append(f"the resumed run ended at step {end2['step']} after {end2['batches']} batches, expected "
                        f"{total} after {total - first}")  # fmt: skip
    return check(results, failures)


def part_detect(ctx: Context) -> dict:
    """``detect.py`` with the COCO ViTDet recipe's model on the built-in digit scenes, bf16, a few steps."""
    ctx.fresh_work()
    recipe = yaml.safe_load((REPO / "configs" / "detect" / "coco_vitdet_base_mask_rcnn.yaml").read_text())
    scenes_data = yaml.safe_load((REPO / "configs" / "detect" / "default.yaml").read_text())["data"]
    model = {**recipe["model"], "checkpoint": None}  # a random ViT-B encoder (no download): the recipe's network
    if ctx.dry_run:
        ctx.note("dry run: the recipe's model settings on a 2-block 32-wide ViT (window 4, global block 1, 16 "
                 "channels), 64 px, batch 2, 2 steps, fp32 on the CPU")  # fmt: skip
        model.update(model="mae_vit_tiny_patch4", model_kwargs={**TINY_KWARGS, "depth": 2}, window_size=4,
                     global_blocks=[1], out_channels=16, head_channels=16, rois_per_image=16,
                     proposals_per_image=50, scales=[2, 1, 0.5, 0.25])  # fmt: skip
        steps, batch, img_size, workers, val_batches = 2, 2, 64, 0, 1
    else:
        steps, batch, img_size, workers, val_batches = 30, 16, 256, 4, 2
    # one epoch of exactly `steps` steps, so its validation (mAP) runs too
    init = {**scenes_data["init_args"], "root": str(ctx.work / "digit_scenes"), "num_train": steps * batch,
            "num_val": val_batches * batch, "img_size": img_size, "batch_size": batch,
            "num_workers": workers}  # fmt: skip
    record = ctx.work / "run.jsonl"
    config = {
        "seed_everything": 0,
        "model": model,
        "data": {"class_path": scenes_data["class_path"], "init_args": init},
        "trainer": {**recipe["trainer"], "accelerator": ctx.accelerator, "devices": 1, "strategy": "auto",
                    "precision": "32-true" if ctx.dry_run else recipe["trainer"]["precision"], "max_steps": steps,
                    "limit_val_batches": val_batches, "num_sanity_val_steps": 0, "log_every_n_steps": 1,
                    "enable_progress_bar": False, "callbacks": [callback(RunRecord, path=str(record))],
                    "logger": {"class_path": CSV_LOGGER, "init_args": {"save_dir": str(ctx.work / "runs"),
                                                                       "name": "detect"}}},
        "checkpoint": {**recipe.get("checkpoint", {}), "dirpath": str(ctx.work / "ckpts")},
        "figures": {"every_n_epochs": 0},
    }  # fmt: skip
    code, out = ctx.entry("detect", "detect.py", "--config", str(ctx.write_config("detect", config)))
    events = read_events(record)
    start = next((e for e in events if e["event"] == "train_start"), {})
    end = next((e for e in events if e["event"] == "train_end"), {})
    rows = read_metrics(ctx.work / "runs" / "detect" / "version_0")
    losses = [float(r["train/loss_step"]) for r in rows if r.get("train/loss_step")] or [
        float(v) for r in rows for k, v in r.items() if k.startswith("train/loss") and v
    ]
    maps = [float(r["val/map"]) for r in rows if r.get("val/map")]
    results = {"exit_status": code, "encoder": model.get("model", "mae_vit_base_patch16 (the recipe's default)"),
               "window_size": model["window_size"], "global_blocks": model["global_blocks"],
               "relative_position": model["relative_position"],
               "activation_checkpointing": model["activation_checkpointing"], "img_size": img_size,
               "batch_size": batch, "precision": start.get("precision"), "device": start.get("device"),
               "steps": end.get("step"), "first_loss": losses[0] if losses else None,
               "last_loss": losses[-1] if losses else None, "val_map": maps[-1] if maps else None,
               "seconds_training": end["time"] - start["time"] if start and end else None}  # fmt: skip
    failures = []
    if code != 0:
        failures.append(f"detect.py exited with {code}: {out[-1500:]}")
    if end.get("step") != steps:
        failures.append(f"trained {end.get('step')} steps, not {steps}")
    if not str(start.get("device")).startswith(ctx.device):
        failures.append(f"trained on {start.get('device')}, not {ctx.device}")
    if not losses or not all(math.isfinite(v) for v in losses):
        failures.append(f"training losses missing or not finite: {losses[:10]}")
    if not maps:
        failures.append("no val/map logged")
    return check(results, failures)


def part_onnx(ctx: Context) -> dict:
    """An encoder trained on the device, exported to ONNX and checked with onnxruntime, on the device too."""
    import numpy as np
    import onnxruntime

    from mae.apps.onnx_encoder import INPUT_NAME, export_onnx
    from mae.convert.backbone import load_backbone
    from mae.data import DigitsDataModule
    from mae.training.pretrain import MAEPretrainModule

    work = ctx.fresh_work()
    steps, img_size, batch = (3, 16, 8) if ctx.dry_run else (50, 32, 64)
    if ctx.dry_run:
        ctx.note("dry run: the tiny model trained 3 steps on the CPU in fp32")
    pl.seed_everything(0)
    module = MAEPretrainModule(img_size=img_size, **default_job_model(ctx))
    before = state_digest(module.model.state_dict())
    trainer = pl.Trainer(accelerator=ctx.accelerator, devices=1, precision=ctx.precision, max_steps=steps,
                         max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                         default_root_dir=work)  # fmt: skip
    trainer.fit(module, datamodule=DigitsDataModule(img_size=img_size, batch_size=batch))
    trained_on = str(trainer.strategy.root_device)
    ckpt = work / "trained.ckpt"
    trainer.save_checkpoint(ckpt)
    changed = len(differing(before, state_digest(module.model.state_dict())))
    onnx_path = work / "encoder.onnx"
    export = export_onnx(ckpt, onnx_path, dynamic_batch=True)
    # onnxruntime against the same encoder run on the training device in fp32 (no TF32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    backbone = load_backbone(str(ckpt)).eval().to(ctx.device)
    pixels = torch.randn(4, 3, img_size, img_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = backbone.forward_features(pixels.to(ctx.device)).float().cpu().numpy()
    providers = onnxruntime.get_available_providers()
    differences = {}
    for provider in [p for p in ("CPUExecutionProvider", "CUDAExecutionProvider") if p in providers]:
        session = onnxruntime.InferenceSession(str(onnx_path), providers=[provider])
        (got,) = session.run(None, {INPUT_NAME: pixels.numpy()})
        differences[provider] = float(np.abs(got - expected).max())
    results = {"trained_on": trained_on, "steps": trainer.global_step, "precision": ctx.precision,
               "tensors_changed_by_training": changed, "onnx_file": str(onnx_path), "opset": export.opset,
               "onnx_mb": onnx_path.stat().st_size / 2**20, "input_shape": export.input_shape,
               "output_shape": export.output_shape,
               "export_check_vs_torch_cpu": {str(k): v for k, v in export.differences.items()},
               "onnxruntime_providers": providers, "vs_encoder_on_device": differences}  # fmt: skip
    failures = []
    if not trained_on.startswith(ctx.device):
        failures.append(f"trained on {trained_on}, not {ctx.device}")
    if trainer.global_step != steps or changed == 0:
        failures.append(f"{trainer.global_step} steps changed {changed} tensors")
    failures += [f"onnxruntime ({p}) differs from the encoder on {ctx.device} by {d:.3g}"
                 for p, d in differences.items() if not d <= 1e-3]  # fmt: skip
    return check(results, failures)


def part_sigterm(ctx: Context) -> dict:
    """SIGTERM between forward and backward of a step of ``train.py``; then ``--ckpt_path last`` continues."""
    ctx.fresh_work()
    signal_step, total, pause = (2, 6, 1.5) if ctx.dry_run else (10, 30, 3.0)
    if ctx.dry_run:
        ctx.note("dry run: the tiny model on the CPU (the step is a CPU step)")
    record, marker = ctx.work / "run.jsonl", ctx.work / "mid_step.json"
    callbacks = [callback(RunRecord, path=str(record)),
                 callback(MidStepPause, step=signal_step, marker=str(marker), seconds=pause)]  # fmt: skip
    config = pretrain_config(ctx, "preempt", default_job_model(ctx), digits(ctx, 32, 8 if ctx.dry_run else 64),
                             callbacks, max_steps=total, max_epochs=-1)  # fmt: skip
    config["checkpoint"] = {"save_top_k": 0}
    command = ["train.py", "--config", str(ctx.write_config("preempt", config))]
    child = start_entry(command, ctx.log("first"), ctx.fresh)
    paused = None
    while child.poll() is None and time.time() < ctx.deadline:
        paused = read_json(marker)
        if paused:
            os.kill(child.pid, signal.SIGTERM)  # the training process only, as `kill PID` does
            break
        time.sleep(0.05)
    code1 = child.wait(max(30.0, ctx.remaining()))
    if code1 is None:
        child.kill()
        code1 = child.returncode
    out1 = tail(ctx.log("first"))
    events = read_events(record)
    saves = [e["step"] for e in events if e["event"] == "save"]
    exception = next((e for e in events if e["event"] == "exception"), {})
    last = next(iter(sorted((ctx.work / "runs" / "preempt").glob("*/checkpoints/last.ckpt"))), None)
    results = {"signalled_at_step": paused and paused["step"], "signalled_device": paused and paused["device"],
               "exit_status": code1, "sigterm_message": "SIGTERM: saved" in out1, "exception": exception.get("type"),
               "saved_step": saves[-1] if saves else None}  # fmt: skip
    failures = []
    if paused is None:
        failures.append(f"the run never reached step {signal_step} (exit status {code1}): {out1[-1500:]}")
    elif code1 != 143 or "SIGTERM: saved" not in out1 or last is None:
        failures.append(f"after SIGTERM: exit status {code1} (expected 143), checkpoint {last}: {out1[-1500:]}")
    elif not paused["device"].startswith(ctx.device):
        failures.append(f"the signalled step ran on {paused['device']}, not {ctx.device}")
    elif not paused["step"] <= results["saved_step"] <= paused["step"] + 1:
        failures.append(f"signalled at step {paused['step']}, saved at step {results['saved_step']}")
    if failures:
        return check(results, failures)
    saved_copy = ctx.work / "preempted.ckpt"
    shutil.copyfile(last, saved_copy)
    code2, out2 = ctx.entry("resume", *command, "--ckpt_path", "last")
    events = read_events(record)
    start2 = [e for e in events if e["event"] == "train_start"][1:2]
    end2 = [e for e in events if e["event"] == "train_end"]
    saved_step = torch.load(saved_copy, map_location="cpu", weights_only=True, mmap=True)["global_step"]
    results.update(resume_exit_status=code2, checkpoint=str(last), checkpoint_step=saved_step,
                   resumed_from_step=start2[0]["step"] if start2 else None,
                   resumed_batches=end2[-1]["batches"] if end2 else None,
                   final_step=end2[-1]["step"] if end2 else None,
                   resumed_device=start2[0]["device"] if start2 else None)  # fmt: skip
    if code2 != 0:
        failures.append(f"the resumed run exited with {code2}: {out2[-1500:]}")
    elif "--ckpt_path last: resuming from" not in out2:
        failures.append("--ckpt_path last did not find the checkpoint")
    if saved_step != results["saved_step"]:
        failures.append(f"last.ckpt holds step {saved_step}, the save callback saw {results['saved_step']}")
    if results["resumed_from_step"] != saved_step:
        failures.append(f"resumed at step {results['resumed_from_step']}, the checkpoint is at {saved_step}")
    if results["final_step"] != total or results["resumed_batches"] != total - saved_step:
        failures.append(f"the resumed run ended at step {results['final_step']} after {results['resumed_batches']} "
                        f"batches, expected {total} after {total - saved_step}")  # fmt: skip
    return check(results, failures)


PART_FUNCTIONS = {
    "throughput": part_throughput,
    "train_shards": part_train_shards,
    "decoders": part_decoders,
    "fsdp": part_fsdp,
    "detect": part_detect,
    "onnx": part_onnx,
    "sigterm": part_sigterm,
}


# ---------------------------------------------------------------- running parts


def run_part(part: str, out: Path, dry_run: bool, fresh: bool, deadline: float) -> int:
    """Run one part in this process and write ``out/<part>.json`` (status ok or failed); 0 when ok."""
    ctx = Context(part, out, dry_run, fresh, deadline)
    start = time.time()
    print(f"== {part} ({'dry run, ' if dry_run else ''}device {ctx.device}, pid {os.getpid()})", flush=True)
    record = {"part": part, "status": "failed", "dry_run": dry_run, "device": ctx.device, "results": {},
              "notes": ctx.notes, "error": None, "log": f"{part}.log"}  # fmt: skip
    try:
        record["results"] = PART_FUNCTIONS[part](ctx)
        record["status"] = "ok"
    except SmokeFailure as failure:
        record.update(results=failure.results, error=str(failure))
    except BaseException as error:  # noqa: BLE001 - any error of a part is its result
        record["error"] = f"{type(error).__name__}: {error}"
        traceback.print_exc()
    record["seconds_in_part"] = time.time() - start
    write_json(out / f"{part}.json", record)
    print(f"== {part}: {record['status']}" + (f" ({record['error'][:500]})" if record["error"] else ""), flush=True)
    return 0 if record["status"] == "ok" else 1


def start_part(part: str, out: Path, dry_run: bool, fresh: bool, deadline: float) -> Child:
    """The part in a process group of its own, its output in ``out/<part>.log``."""
    log = out / f"{part}.log"
    log.write_text("")
    if fresh:
        command = [sys.executable, __file__, part, "--out", str(out), "--deadline", str(deadline), "--fresh"]
        with open(log, "ab") as f:
            popen = subprocess.Popen(command + (["--dry-run"] if dry_run else []), cwd=REPO, stdout=f,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=fresh_env(),
                                     start_new_session=True)  # fmt: skip
        return Child(popen.pid, popen.pid, popen)
    _flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            _in_child(log, new_group=True)
            code = run_part(part, out, dry_run, fresh, deadline)
        finally:
            _exit_child(code)
    try:
        os.setpgid(pid, pid)  # also here: killpg must find the group even if the child has not set it yet
    except (PermissionError, ProcessLookupError):
        pass
    return Child(pid, pid)


def part_limits(part: str, dry_run: bool) -> tuple[float, float]:
    """(time limit, least time left to start) of ``part``: ``LIMITS`` (``DRY_LIMIT`` in the dry run) or
    ``GPU_SMOKE_LIMIT_<PART>`` / ``GPU_SMOKE_MIN_<PART>``."""
    limit, minimum = (DRY_LIMIT, DRY_MIN) if dry_run else LIMITS[part]
    limit = float(os.environ.get(f"GPU_SMOKE_LIMIT_{part.upper()}", limit))
    minimum = float(os.environ.get(f"GPU_SMOKE_MIN_{part.upper()}", min(minimum, limit)))
    return limit, minimum


def load_preloads(parts: list[str]) -> None:
    """Import what the parts use once, before forking them (no torch op, no CUDA)."""
    modules = ["torchvision", "timm", "jsonargparse", "mae.cli", "mae.data", "mae.training.pretrain",
               "benchmarks.dataloader"]  # fmt: skip
    for part in parts:
        modules += {"throughput": ["transformers", "benchmarks.throughput"],
                    "decoders": ["benchmarks.time_to_quality"], "detect": ["mae.dense", "mae.cli.dense"],
                    "onnx": ["onnx", "onnxruntime", "onnxscript", "mae.apps.onnx_encoder"]}.get(part, [])  # fmt: skip
    for name in modules:
        try:
            __import__(name)
        except Exception as error:  # noqa: BLE001 - the part that needs it fails, saying so
            print(f"preload {name}: {type(error).__name__}: {error}", flush=True)


def finish_record(out: Path, part: str, status: str | None, code: int | None, seconds: float, limit: float,
                  pgid: int | None, dry_run: bool, reason: str = "") -> dict:  # fmt: skip
    """``out/<part>.json`` completed by the driver: its status (the part's own, or timeout / failed / skipped
    when the part could not write one), seconds, limit and log."""
    path = out / f"{part}.json"
    record = read_json(path) if status != "skipped" else None
    if not isinstance(record, dict) or (status == "timeout"):
        previous = record if isinstance(record, dict) else {}
        record = {"part": part, "dry_run": dry_run, "device": "cpu" if dry_run else "cuda",
                  "results": previous.get("results", {}), "notes": previous.get("notes", []),
                  "log": f"{part}.log"}  # fmt: skip
        if status == "timeout":
            record["error"] = (
                f"killed after its time limit of {limit:.0f} s; log tail: {tail(out / f'{part}.log', 1500)}"
            )
        elif status == "skipped":
            record["error"] = reason
        else:
            status = "failed"
            record["error"] = f"exit status {code} without a result; log tail: {tail(out / f'{part}.log', 1500)}"
    record["status"] = status or record.get("status", "failed")
    if record["status"] == "ok" and code not in (0, None):
        record.update(status="failed", error=f"exit status {code}")
    record.update(seconds=round(seconds, 2), limit_s=round(limit, 1), exit_status=code, pgid=pgid)
    write_json(path, record)
    return record


def run_all(args: argparse.Namespace) -> int:
    """Every selected part in a forked process group of its own, each under its time limit; summary.json."""
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    deadline = args.deadline or started + (600 if args.dry_run else 455)
    parts = args.parts or list(PARTS)
    load_preloads(parts)
    summary = {"dry_run": args.dry_run, "device": "cpu" if args.dry_run else "cuda", "parts_requested": parts,
               "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)), "deadline": deadline,
               "budget_s": round(deadline - started, 1), "fresh_interpreters": args.fresh, "parts": []}  # fmt: skip
    current: list[Child] = []

    def stop(signum: int, frame: Any) -> None:  # the script's own deadline or Ctrl-C: no part left running
        for child in current:
            child.kill_group()
        summary["interrupted_by"] = signal.Signals(signum).name
        write_summary(out, summary, started)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for part in parts:
        limit, minimum = part_limits(part, args.dry_run)
        left = deadline - time.time()
        allowed = min(limit, left)
        (out / f"{part}.json").unlink(missing_ok=True)
        if allowed < minimum:
            reason = f"{left:.0f} s left before the deadline, the part needs at least {minimum:.0f} s"
            (out / f"{part}.log").write_text(f"== {part}: skipped: {reason}\n")
            record = finish_record(out, part, "skipped", None, 0.0, allowed, None, args.dry_run, reason)
        else:
            begin = time.time()
            child = start_part(part, out, args.dry_run, args.fresh, begin + allowed)
            current[:] = [child]
            code = child.wait(allowed)
            status = None
            if code is None:
                child.kill_group()
                code, status = child.returncode, "timeout"
            current.clear()
            record = finish_record(out, part, status, code, time.time() - begin, allowed, child.pgid, args.dry_run)
        summary["parts"].append({k: record.get(k) for k in ("part", "status", "seconds", "limit_s", "error")})
        write_summary(out, summary, started)
        print(f"{part:14s} {record['status']:8s} {record['seconds']:7.1f} s (limit {record['limit_s']:.0f} s)"
              + (f"  {str(record.get('error')).splitlines()[0][:300]}" if record["status"] != "ok" else ""),
              flush=True)  # fmt: skip
    return 0 if all(p["status"] == "ok" for p in summary["parts"]) else 1


def write_summary(out: Path, summary: dict, started: float) -> None:
    summary["seconds"] = round(time.time() - started, 2)
    summary["counts"] = {s: sum(p["status"] == s for p in summary["parts"]) for s in STATUSES}
    summary["all_ok"] = summary["counts"]["ok"] == len(summary["parts_requested"])
    write_json(out / "summary.json", summary)


def build_parser() -> argparse.ArgumentParser:
    """The script's options (what ``parse`` reads, before its own checks)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["run", *PARTS], help="run: the selected parts, each under its time limit; "
                   "a part's name: that part alone, in this process")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("gpu_smoke_results"))
    p.add_argument("--dry-run", action="store_true", help="every part on the CPU with tiny sizes")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=None, help="run: these parts only (default: all)")
    p.add_argument("--deadline", type=float, default=None,
                   help="time.time() by which everything must end (default: now + 455 s, dry run 600 s)")  # fmt: skip
    p.add_argument("--fresh", action="store_true", default=os.environ.get("GPU_SMOKE_FRESH") == "1",
                   help="a fresh interpreter for each part and entry point instead of forks "
                   "(GPU_SMOKE_FRESH=1)")  # fmt: skip
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    args.out = args.out.resolve()
    if args.parts:
        args.parts = [part for part in PARTS if part in args.parts]  # PARTS' order
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.command == "run":
        return run_all(args)
    args.out.mkdir(parents=True, exist_ok=True)
    return run_part(args.command, args.out, args.dry_run, args.fresh, args.deadline or time.time() + 3600)


if __name__ == "__main__":
    sys.exit(main())
