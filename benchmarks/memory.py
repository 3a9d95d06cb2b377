"""Activation memory and step time of a pretraining step and a fine-tuning step, with and without activation
checkpointing (``model.grad_checkpointing``), on the CPU.

Cases: pretraining (mask ratio 0.75, norm_pix_loss) of ViT-B/16 and ViT-L/16 at 224 px, batch 8;
fine-tuning (the ViT classifier with 1000 classes, drop path 0.1, cross-entropy) of ViT-B/16 and ViT-L/16 at
224 px, batch 4, and at 384 px, batch 2. A step is forward, backward and the AdamW step, in the precision
and with the attention kernel and AdamW that ``mae pretrain`` takes on this machine by default
(``mae.training.runtime.training_settings``; eager, no ``torch.compile``).

Each case runs in a process of its own, forked before any torch operation ran, so no earlier case's memory
is mapped in it: it builds the model and AdamW, takes one warm-up step (which allocates the gradients,
AdamW's state and the kernels' scratch), then resets the resident-memory peak (Linux ``clear_refs``) and
takes the timed steps. **Activation memory** is the peak resident memory of the timed steps minus the
resident memory before them (model, gradients, optimizer state), in MiB. Freed blocks of 128 KiB or more
go back to the system at once (glibc's ``M_MMAP_THRESHOLD`` fixed at 128 KiB), so that the warm-up step's
activations are not left mapped, where they would hide the timed steps'. **Step time** is the median of
the timed steps.

    python benchmarks/memory.py                       # every case (10 minutes or more on 2 cores)
    python benchmarks/memory.py --dry-run --out /tmp/memory.json   # tiny model, seconds: checks the script

Writes ``benchmarks/results/memory_cpu.json`` (``--out``) after each case (``cases_done``), which
docs/performance.md shows.
"""

import argparse
import ctypes
import ctypes.util
import datetime
import json
import multiprocessing
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from harness import machine, reset_resident_peak, resident_kib, write_results

from mae.convert.backbone import build_vit
from mae.models import create_model
from mae.training.runtime import default_precision, set_attention_kernel, training_settings

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "memory_cpu.json"
MODELS = {"ViT-B/16": "mae_vit_base_patch16", "ViT-L/16": "mae_vit_large_patch16"}
# (task, model, input size in px, batch size)
CASES = [
    ("pretrain", "ViT-L/16", 224, 8),
    ("pretrain", "ViT-B/16", 224, 8),
    ("finetune", "ViT-B/16", 224, 4),
    ("finetune", "ViT-L/16", 224, 4),
    ("finetune", "ViT-B/16", 384, 2),
    ("finetune", "ViT-L/16", 384, 2),
]
DRY_RUN_CASES = [("pretrain", "tiny", 32, 2), ("finetune", "tiny", 32, 2)]
TINY = dict(embed_dim=32, depth=2, num_heads=2, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2)
MASK_RATIO = 0.75


def return_freed_memory() -> None:
    """Every allocation of 128 KiB or more its own mapping, unmapped when freed (glibc otherwise raises this
    threshold as blocks are freed, and keeps them mapped). Linux/glibc."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    m_mmap_threshold = -3
    if not libc.mallopt(m_mmap_threshold, 128 * 2**10):
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed: the measurement needs glibc")


def build_step(
    task: str,
    model: str,
    img_size: int,
    batch_size: int,
    checkpointing: bool,
    precision: str,
    device: str = "cpu",
):
    """``step()``: one training step of the case on a fixed random batch on ``device``."""
    torch.manual_seed(0)
    name, kwargs = ("mae_vit_tiny_patch4", TINY) if model == "tiny" else (MODELS[model], {})
    settings = training_settings(device, precision)
    mae = create_model(name, img_size=img_size, norm_pix_loss=True, **kwargs)
    if task == "pretrain":
        network = mae
    else:
        network = build_vit(mae.config, img_size, global_pool="avg", num_classes=1000, drop_path_rate=0.1)
        del mae
    network.set_grad_checkpointing(checkpointing)
    set_attention_kernel(network, settings.attention)
    network.to(device).train()
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-4, fused=settings.fused_adamw)
    imgs = torch.randn(batch_size, 3, img_size, img_size, device=device)
    targets = torch.randint(0, 1000, (batch_size,), device=device)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32

    def step() -> None:
        with torch.autocast(torch.device(device).type, dtype=dtype, enabled=precision == "bf16"):
            if task == "pretrain":
                loss = network(imgs, MASK_RATIO)[0]
            else:
                loss = F.cross_entropy(network(imgs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # the gradients stay allocated: part of the baseline

    return step


def measure_step(step, steps: int, device: str = "cpu") -> dict:
    """After one warm-up ``step()`` (gradients, AdamW state, kernels): the memory held before the timed steps
    (``baseline_mib``), their peak, the peak above the baseline (``activation_mib``) and the median step
    time. On the CPU resident memory (this process's: run it in a fresh one), on a GPU CUDA's allocations."""
    cuda = torch.device(device).type == "cuda"
    step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated() / 2**20
    else:
        reset_resident_peak()
        baseline = resident_kib()[0] / 1024
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else resident_kib()[1] / 1024
    return {
        "baseline_mib": round(baseline),
        "peak_mib": round(peak),
        "activation_mib": round(peak - baseline),
        "step_s": round(statistics.median(times), 3),
        "steps": steps,
    }


def measure(case: dict) -> dict:
    """One case (``build_step``'s arguments, ``steps`` and ``threads``) in this fresh process, on the CPU."""
    return_freed_memory()
    torch.set_num_threads(case.pop("threads"))
    steps = case.pop("steps")
    return measure_step(build_step(**case), steps)


def _child(case: dict, connection) -> None:
    try:
        connection.send(measure(case))
    except BaseException as error:  # the parent reports it
        connection.send({"error": f"{type(error).__name__}: {error}"})


def measure_in_child(case: dict) -> dict:
    """``measure(case)`` in a process forked from this one (which has run no torch operation)."""
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(case, child))
    process.start()
    child.close()
    result = parent.recv()
    process.join()
    if "error" in result:
        raise RuntimeError(f"case {case} failed: {result['error']}")
    return result


def summarise(rows: list[dict]) -> list[dict]:
    """Per case: activation memory and step time with checkpointing against without (fractions)."""
    summary = []
    for off in (r for r in rows if not r["grad_checkpointing"]):
        key = {k: off[k] for k in ("task", "model", "img_size", "batch_size")}
        on = next(r for r in rows if r["grad_checkpointing"] and all(r[k] == v for k, v in key.items()))
        summary.append(
            {
                **key,
                "activation_mib": [off["activation_mib"], on["activation_mib"]],
                "activation_saved": round(1 - on["activation_mib"] / max(off["activation_mib"], 1), 3),
                "step_s": [off["step_s"], on["step_s"]],
                "time_added": round(on["step_s"] / off["step_s"] - 1, 3),
            }
        )
    return summary


def print_summary(summary: list[dict]) -> None:
    """One line per case: activation memory and step time without -> with checkpointing."""
    for line in summary:
        print(
            f"{line['task']} {line['model']} {line['img_size']} px batch {line['batch_size']}: activation "
            f"{line['activation_mib'][0]} -> {line['activation_mib'][1]} MiB "
            f"(-{line['activation_saved']:.0%}), step {line['step_s'][0]} -> {line['step_s'][1]} s "
            f"(+{line['time_added']:.0%})"
        )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="a tiny model at 32 px, 1 timed step")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file (JSON)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per case (after one warm-up)")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default=default_precision("cpu"))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    cases, steps = (DRY_RUN_CASES, 1) if args.dry_run else (CASES, args.steps)
    rows, load_before = [], os.getloadavg()[0]
    for task, model, img_size, batch_size in cases:
        for checkpointing in (False, True):
            case = dict(task=task, model=model, img_size=img_size, batch_size=batch_size)
            case.update(checkpointing=checkpointing, precision=args.precision)
            result = measure_in_child({**case, "steps": steps, "threads": args.threads})
            shown = {k: v for k, v in case.items() if k != "checkpointing"}
            rows.append({**shown, "grad_checkpointing": checkpointing, **result})
            print(json.dumps(rows[-1]), flush=True)
        results = {
            "machine": machine(),
            "threads": args.threads,
            "precision": args.precision,
            "date": datetime.date.today().isoformat(),
            "dry_run": args.dry_run,
            "cases_done": f"{len(rows) // 2} of {len(cases)}",
            # the 1-minute load average before and after: other work slows the steps (not the memory)
            "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            "rows": rows,
            "summary": summarise(rows),
        }
        write_results(args.out, results)  # after each case: an interrupted run keeps those done
    print_summary(results["summary"])
    return results


if __name__ == "__main__":
    main()
