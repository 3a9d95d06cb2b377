"""Peak memory per process of a ViT-L/16 MAE pretraining step on 2 CPU processes: DDP against FSDP2
(``--config strategy/fsdp``), each without and with activation checkpointing (``model.grad_checkpointing``).

Each configuration is one run of the real ``mae pretrain`` command (``--trainer.devices 2
--trainer.accelerator cpu --trainer.precision 32-true``, batch 2 per process, 224 px, mask ratio 0.75,
``--steps`` optimizer steps, one thread per process) on a folder of random 224 px JPEGs this script writes.
The runs go one after another, never two at once (ViT-L/16 under DDP takes about 9 GB per process, 18 GB
for the two; a run is killed when the machine's available memory falls under ``--memory-floor``). The
``StepMemory`` callback below, added to each run's ``trainer.callbacks``, writes one JSON per process after
the last step:

- **peak RSS**: the process's peak resident memory (Linux ``VmHWM``) over the training steps (reset when
  training starts), and before them (start-up: each process builds the whole model, which FSDP2 then
  shards), in MiB. It counts every page the process has mapped: the allocator's free lists
  included (``mae pretrain`` keeps freed pages, ``mae.training.runtime.keep_freed_memory``), DDP's gradient
  buckets, the activations, torch's and Python's own code;
- **tensor bytes**: exactly, from the tensors this process holds after the step, the bytes of the
  parameters, their gradients and AdamW's state (under FSDP2 the local shards, ``DTensor.to_local()``).

FSDP2 (ZeRO-3) holds each parameter, gradient and optimizer state once across the processes, so each of 2
processes should hold about half of DDP's tensor bytes.

    python benchmarks/memory_sharded.py              # ViT-L/16, 4 runs, about 7 minutes on 2 cores
    python benchmarks/memory_sharded.py --dry-run --out /tmp/memory_sharded.json   # a tiny model at 32 px

Writes ``benchmarks/results/memory_sharded_cpu.json`` (``--out``) after each run (``configs_done``), which
docs/performance.md shows.
"""

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
import yaml
from harness import machine, reset_resident_peak, resident_kib, write_results
from PIL import Image
from torch.distributed.tensor import DTensor

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "memory_sharded_cpu.json"
PROCESSES = 2
# (strategy, its arguments to mae pretrain), each run without and with activation checkpointing
STRATEGIES = [("DDP", ("--trainer.strategy", "ddp")), ("FSDP2", ("--config", "strategy/fsdp"))]
MODEL = {"model": "mae_vit_large_patch16"}
TINY_MODEL = {
    "model": "mae_vit_tiny_patch4",
    "model_kwargs": dict(
        embed_dim=32, depth=2, num_heads=2, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2
    ),
}


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct ``tensors`` this process holds (a DTensor's local shard), each counted once."""
    seen, total = set(), 0
    for tensor in tensors:
        if isinstance(tensor, DTensor):
            tensor = tensor.to_local()
        if isinstance(tensor, torch.Tensor) and tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


class StepMemory(pl.Callback):
    """After optimizer step ``at_step``: this process's peak resident memory and the bytes of the parameters,
    gradients and optimizer state it holds, written to ``<out_dir>/rank<global rank>.json``.

    Args:
        out_dir: folder of the per-process JSON files.
        at_step: the optimizer step (1-based) after which to measure; the run's last.
    """

    def __init__(self, out_dir: str, at_step: int) -> None:
        self.out_dir = Path(out_dir)
        self.at_step = at_step

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # the peak so far: building the model (whole, before FSDP2 shards it), DDP's or FSDP2's set-up
        self.startup_peak_kib = resident_kib()[1]
        reset_resident_peak()  # the peak from here: the training steps'

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != self.at_step:
            return
        params = list(pl_module.parameters())
        grads = [p.grad for p in params if p.grad is not None]
        state = [v for s in trainer.optimizers[0].state.values() for v in s.values()]
        rss_kib, peak_kib = resident_kib()
        row = {
            "rank": trainer.global_rank,
            "step": trainer.global_step,
            "peak_rss_mib": round(peak_kib / 1024),
            "startup_peak_rss_mib": round(self.startup_peak_kib / 1024),
            "rss_mib": round(rss_kib / 1024),
            "sharded_parameters": sum(isinstance(p, DTensor) for p in params),
            "parameters": len(params),
            "gradients": len(grads),
            "parameter_mib": tensor_bytes(params) / 2**20,
            "gradient_mib": tensor_bytes(grads) / 2**20,
            "optimizer_mib": tensor_bytes(state) / 2**20,
        }
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(row) + "\n")


def write_images(root: Path, count: int, size: int) -> None:
    """``count`` random ``size`` px JPEGs in ``root/train/a`` (no validation split)."""
    folder = root / "train" / "a"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"img_{i:03d}.jpg", quality=90)


def available_mib() -> int:
    """The machine's available memory (Linux ``MemAvailable``), in MiB."""
    with open("/proc/meminfo") as f:
        return int(next(line for line in f if line.startswith("MemAvailable:")).split()[1]) // 1024


def run_config(
    work: Path,
    config: Path,
    name: str,
    strategy_args: tuple[str, ...],
    checkpointing: bool,
    steps: int,
    memory_floor_mib: int,
) -> dict:
    """One ``mae pretrain`` run in a fresh command; its processes' rows (StepMemory's) and its seconds.

    The run is killed (its whole process group) and RuntimeError raised when the machine's available memory
    falls under ``memory_floor_mib``: before the kernel's out-of-memory killer picks some other process."""
    out = work / name
    command = [sys.executable, "-m", "mae", "pretrain", "--config", str(config), *strategy_args]
    command += ["--model.grad_checkpointing", str(checkpointing).lower()]
    command += ["--trainer.callbacks+=memory_sharded.StepMemory", "--trainer.callbacks.out_dir", str(out)]
    command += ["--trainer.callbacks.at_step", str(steps)]
    command += ["--trainer.logger.init_args.name", name]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "benchmarks"), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",  # one core per process: 2 processes on 2 cores
    }
    log = work / f"{name}.log"
    start, lowest = time.perf_counter(), available_mib()
    with open(log, "w") as output:
        process = subprocess.Popen(
            command, cwd=work, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
        while process.poll() is None:
            lowest = min(lowest, available_mib())
            if lowest < memory_floor_mib:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                raise RuntimeError(f"{name}: killed, the machine's available memory fell to {lowest} MiB")
            time.sleep(0.2)
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        raise RuntimeError(f"{name} failed ({process.returncode}):\n{log.read_text()[-3000:]}")
    rows = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(PROCESSES)]
    return {"rows": rows, "seconds": round(seconds), "lowest_available_mib": lowest}


def write_config(work: Path, model: dict, img_size: int, batch_size: int, steps: int) -> Path:
    """The runs' common config: ``steps`` optimizer steps (one epoch) on ``work/data``, no validation, no
    monitors, no checkpoint; CSV metrics under ``work/runs``."""
    write_images(work / "data", PROCESSES * batch_size * steps, img_size)
    config = {
        "seed_everything": 0,
        "model": {**model, "mask_ratio": 0.75, "target": "norm_pix", "optim": {"warmup_epochs": 0}},
        "data": {
            "class_path": "mae.data.ImageFolderDataModule",
            "init_args": {
                "root": str(work / "data"),
                "img_size": img_size,
                "batch_size": batch_size,
                "num_workers": 0,  # loader workers forked from a 7 GB process would be measured too
            },
        },
        "trainer": {
            "max_steps": steps,
            "accelerator": "cpu",
            "devices": PROCESSES,
            "precision": "32-true",
            "enable_progress_bar": False,
            "log_every_n_steps": 1,
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(work / "runs"), "name": "memory"},
            },
        },
        "checkpoint": {"dirpath": str(work / "checkpoints"), "save_last": False, "save_top_k": 0},
        "reconstruction": {"every_n_epochs": 0},
        "knn": {"every_n_epochs": 0},
    }
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def per_process(rows: list[dict]) -> dict:
    """The larger process's figures (MiB): peak RSS of the steps and of start-up, and the tensor bytes."""
    tensors = [r["parameter_mib"] + r["gradient_mib"] + r["optimizer_mib"] for r in rows]
    summary = {key: max(r[key] for r in rows) for key in ("peak_rss_mib", "startup_peak_rss_mib")}
    for key in ("parameter_mib", "gradient_mib", "optimizer_mib"):
        summary[key] = round(max(r[key] for r in rows), 1)
    summary["tensor_mib"] = round(max(tensors), 1)
    return summary


def compare(configs: list[dict]) -> list[dict]:
    """Per checkpointing setting: FSDP2's per-process figures as fractions of DDP's."""
    found = []
    for checkpointing in (False, True):
        pair = {c["strategy"]: c["per_process"] for c in configs if c["grad_checkpointing"] == checkpointing}
        if len(pair) == 2:
            ddp, fsdp = pair["DDP"], pair["FSDP2"]
            found.append(
                {
                    "grad_checkpointing": checkpointing,
                    "tensor_fraction": round(fsdp["tensor_mib"] / ddp["tensor_mib"], 3),
                    "peak_rss_fraction": round(fsdp["peak_rss_mib"] / ddp["peak_rss_mib"], 3),
                }
            )
    return found


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="a tiny model at 32 px: checks the script")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file (JSON)")
    parser.add_argument(
        "--steps", type=int, default=3, help="optimizer steps per run, measured after the last"
    )
    parser.add_argument("--work", type=Path, help="folder of the runs (default: a temporary one, removed)")
    parser.add_argument(
        "--memory-floor",
        type=int,
        default=1024,
        help="MiB: a run is killed when the machine's available memory falls under this",
    )
    args = parser.parse_args(argv)
    model, img_size, batch_size = (TINY_MODEL, 32, 2) if args.dry_run else (MODEL, 224, 2)
    with tempfile.TemporaryDirectory(prefix="memory_sharded-") as tmp:
        work = args.work or Path(tmp)
        config = write_config(work, model, img_size, batch_size, args.steps)
        configs, started = [], time.perf_counter()
        for checkpointing in (False, True):
            for strategy, strategy_args in STRATEGIES:
                name = f"{strategy.lower()}{'_checkpointing' if checkpointing else ''}"
                run = run_config(
                    work, config, name, strategy_args, checkpointing, args.steps, args.memory_floor
                )
                configs.append(
                    {
                        "strategy": strategy,
                        "grad_checkpointing": checkpointing,
                        "per_process": per_process(run["rows"]),
                        "seconds": run["seconds"],
                        "lowest_available_mib": run["lowest_available_mib"],
                        "ranks": run["rows"],
                    }
                )
                print(json.dumps({k: v for k, v in configs[-1].items() if k != "ranks"}), flush=True)
                results = {
                    "machine": machine(),
                    "model": model["model"],
                    "img_size": img_size,
                    "batch_size_per_process": batch_size,
                    "processes": PROCESSES,
                    "precision": "32-true",
                    "steps": args.steps,
                    "date": datetime.date.today().isoformat(),
                    "dry_run": args.dry_run,
                    "configs_done": f"{len(configs)} of {2 * len(STRATEGIES)}",
                    "minutes": round((time.perf_counter() - started) / 60, 1),
                    "configs": configs,
                    "fsdp2_of_ddp": compare(configs),
                }
                write_results(args.out, results)  # after each run: an interrupted benchmark keeps those done
    for line in results["fsdp2_of_ddp"]:
        print(
            f"FSDP2 / DDP{' with checkpointing' if line['grad_checkpointing'] else ''}: parameters, "
            f"gradients and AdamW state per process x{line['tensor_fraction']}, "
            f"peak RSS x{line['peak_rss_fraction']}"
        )
    return results


if __name__ == "__main__":
    main()
