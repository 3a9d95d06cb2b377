"""MAE pretraining-step throughput: ours vs Hugging Face ``ViTMAEForPreTraining``, interleaved in one process.

A step is forward + backward + AdamW step with mask ratio 0.75 and norm_pix_loss, on the same
weights and the same masks for both implementations. Each round times ``--steps`` steps of every
contender in turn (A B C ... A B C ..., the order rotating every round), so drift in the machine's
speed hits all of them alike; the table reports medians over rounds. For each config it prints
images/s, the ratio to the best Hugging Face variant, achieved GFLOP/s from the analytic FLOP count
(matmuls only, ``mae/models/flops.py``) and its fraction of the measured matmul peak (one large
``torch.mm`` of the same dtype on the same threads), peak memory of a training step, and minor page
faults per step on CPU.

    python benchmarks/throughput.py                            # cifar, tiny224, base224 (large224 on request)
    python benchmarks/throughput.py --configs cifar --rounds 3 # one config, quicker
    python benchmarks/throughput.py --configs base224 --batch-size 256 --device cuda  # GPU run
    bash benchmarks/gpu_check.sh                                                    # the whole GPU check

Variants: ``fp32`` / ``bf16`` (autocast), ``sdpa`` / ``explicit`` attention, ``compile``
(``torch.compile`` of the model; its compilation happens in the untimed warm-up steps), ``fused AdamW``.
"ours default" is what ``train.py`` runs with its default settings on this device for a long run
(``mae.training.runtime.training_settings``). The host allocator (``--allocator``): by default the whole
process, peers included, keeps freed memory mapped as ``train.py`` does (``kept``); ``glibc`` runs
everyone with the C library's defaults; ``shipped`` runs each implementation as it ships (ours as
``train.py`` sets it up, Hugging Face with glibc's defaults), which takes a fresh process per timed
block, since the setting is per process (rounds still interleave the contenders).
"""

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
from harness import cpu_name, reset_resident_peak, resident_kib

from mae.convert.huggingface import save_hf_pretrained
from mae.models import MaskedAutoencoderViT, create_model
from mae.models.flops import mae_train_flops
from mae.training.optim import weight_decay_groups
from mae.training.runtime import (
    TrainingSettings,
    keep_freed_memory,
    native_bf16,
    set_attention_kernel,
    training_settings,
)

MASK_RATIO = 0.75

# Issue 7's configs, as registered models: the CIFAR-size MAE, ViT-Tiny/16 and ViT-B/16 at 224 px, and
# (not run by default, for the GPU run) the paper's ViT-L/16, the official code's anchor.
CONFIGS = {
    "cifar": dict(model="mae_vit_tiny_patch4", batch_size=128),
    "tiny224": dict(model="mae_vit_tiny_patch16", batch_size=32),
    "base224": dict(model="mae_vit_base_patch16", batch_size=16),
    "large224": dict(model="mae_vit_large_patch16", batch_size=16),
}
DEFAULT_CONFIGS = ["cifar", "tiny224", "base224"]


@dataclass(frozen=True)
class Contender:
    impl: str  # "ours" or "hf"
    settings: TrainingSettings
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or f"{self.impl} {self.settings.describe()}"


def contenders(device: torch.device, variants: list[str]) -> list[Contender]:
    """Hugging Face's four precision x attention variants, ours on the same four, ours default, and the
    default with compile and with fused AdamW flipped (so each choice's effect is visible)."""
    out = []
    default = training_settings(device)
    if "peers" in variants:
        for precision in ("fp32", "bf16"):
            for attention in ("sdpa", "explicit"):
                plain = TrainingSettings(
                    precision=precision, attention=attention, compile=False, fused_adamw=False
                )
                out += [Contender("hf", plain), Contender("ours", plain)]
    if "default" in variants:
        out.append(Contender("ours", default, f"ours default ({default.describe()})"))
    if "ablations" in variants:  # the default with one choice flipped
        out.append(Contender("ours", replace(default, compile=not default.compile)))
        out.append(Contender("ours", replace(default, fused_adamw=not default.fused_adamw)))
    return out


def reference_model(name: str) -> MaskedAutoencoderViT:
    """The weights every contender starts from (Hugging Face's are these, converted): the registered
    model ``name`` with normalised-pixel targets, as the paper's recipe trains it."""
    torch.manual_seed(0)
    return create_model(name, norm_pix_loss=True)


def build_step(
    contender: Contender, model_name: str, device: torch.device, hf_dir: str, batch_size: int
) -> Callable[[], torch.Tensor]:
    """A closure running one training step of ``contender`` on a fixed batch and fixed masks, with the
    pretraining module's optimizer: AdamW (0.9, 0.95), weight decay 0.05 on weights only
    (``mae.training.optim.weight_decay_groups``). ``hf_dir`` holds ``reference_model(model_name)``
    saved with ``save_hf_pretrained``."""
    ours = reference_model(model_name)
    gen = torch.Generator().manual_seed(0)
    imgs = torch.randn(batch_size, 3, *ours.patch_embed.img_size, generator=gen).to(device)
    noise = torch.rand(batch_size, ours.num_patches, generator=gen).to(device)
    settings = contender.settings
    if contender.impl == "hf":
        import transformers

        transformers.utils.logging.disable_progress_bar()
        attn = {"sdpa": "sdpa", "explicit": "eager"}[settings.attention]
        model = transformers.ViTMAEForPreTraining.from_pretrained(hf_dir, attn_implementation=attn).to(device)
        model.train()

        def loss_fn():
            return model(pixel_values=imgs, noise=noise).loss

    else:
        model = ours.to(device).train()
        set_attention_kernel(model, settings.attention)  # as MAETrainingModule.setup / on_fit_start do
        if settings.compile:
            model.compile()

        def loss_fn():
            return model(imgs, MASK_RATIO, noise)[0]

    optimizer = torch.optim.AdamW(
        weight_decay_groups(model, 0.05), lr=1e-4, betas=(0.9, 0.95), fused=settings.fused_adamw
    )
    autocast = settings.precision == "bf16"

    def step() -> torch.Tensor:  # the loss, left on the device (no sync per step)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    step.optimizer = optimizer  # for inspection
    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak_gflops(dtype: torch.dtype, device: torch.device, reps: int = 5) -> float:
    """Best GFLOP/s of an n x n x n ``torch.mm`` (the machine's practical matmul ceiling); n = 2048 on
    CPU, 8192 on a GPU; 512 for bf16 on a CPU that only emulates it (a 2048 one takes about a minute
    there, and the emulated rate hardly depends on the size)."""
    n = 8192 if device.type == "cuda" else 2048
    if device.type == "cpu" and dtype == torch.bfloat16 and not native_bf16(device):
        n = 512
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def process_allocator(contender: Contender, allocator: str) -> str:
    """The allocator setting ("kept" or "glibc") of ``contender``'s process under ``--allocator``."""
    if allocator == "shipped":
        return "kept" if contender.impl == "ours" else "glibc"
    return allocator


def _probe(flag: str, payload: dict, contender: Contender, allocator: str) -> list[float]:
    """Run this script with ``flag`` in a fresh process; the numbers of its last output line."""
    result = subprocess.run(
        [
            sys.executable,
            __file__,
            flag,
            json.dumps(payload),
            "--allocator",
            process_allocator(contender, allocator),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{flag} for {contender.name} failed:\n{result.stderr[-2000:]}")
    return [float(x) for x in result.stdout.strip().splitlines()[-1].split()]


def cpu_peak_memory_mib(
    contender: Contender, config: str, batch_size: int, allocator: str, steps: int = 3
) -> float:
    """Peak resident memory of CPU training steps (activations, gradients, AdamW state) above what the
    process held with the model built, in MiB; measured in a fresh process, where no earlier step's
    freed memory hides the peak."""
    payload = {
        "contender": [contender.impl, asdict(contender.settings)],
        "config": config,
        "batch_size": batch_size,
        "steps": steps,
    }
    return _probe("--memory-probe", payload, contender, allocator)[0]


def _memory_probe(probe: str) -> None:
    spec = json.loads(probe)
    impl, settings = spec["contender"]
    contender = Contender(impl, TrainingSettings(**settings))
    model_spec = CONFIGS[spec["config"]]["model"]
    with tempfile.TemporaryDirectory() as hf_dir:
        save_hf_pretrained(reference_model(model_spec), hf_dir, MASK_RATIO)
        step = build_step(contender, model_spec, torch.device("cpu"), hf_dir, spec["batch_size"])
        gc.collect()
        reset_resident_peak()
        before, _ = resident_kib()
        for _ in range(spec["steps"]):
            step()
        _, peak = resident_kib()
    print((peak - before) / 1024)


def timed_block_in_process(contender: Contender, config: str, args: argparse.Namespace, hf_dir: str):
    """``time_steps`` of ``contender`` (after ``--warmup`` steps) in a fresh process with its own
    allocator setting: (seconds, page faults per step, CUDA peak MiB or None)."""
    payload = {
        "contender": [contender.impl, asdict(contender.settings)],
        "config": config,
        "hf_dir": hf_dir,
        "batch_size": args.batch_size or CONFIGS[config]["batch_size"],
        "device": args.device,
        "warmup": args.warmup,
        "steps": args.steps,
    }
    seconds, faults, memory = _probe("--time-probe", payload, contender, args.allocator)
    return seconds, faults, None if memory < 0 else memory


def _time_probe(probe: str) -> None:
    spec = json.loads(probe)
    impl, settings = spec["contender"]
    device = torch.device(spec["device"])
    model_spec = CONFIGS[spec["config"]]["model"]
    step = build_step(
        Contender(impl, TrainingSettings(**settings)), model_spec, device, spec["hf_dir"], spec["batch_size"]
    )
    for _ in range(spec["warmup"]):
        step()
    seconds, faults, memory = time_steps(step, spec["steps"], device)
    print(seconds, faults, -1 if memory is None else memory)


def time_steps(step: Callable, steps: int, device: torch.device) -> tuple[float, float, float | None]:
    """Seconds for ``steps`` steps, minor page faults per step, and on CUDA the peak memory the steps
    allocated above what was allocated before them (MiB)."""
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        resident = torch.cuda.memory_allocated()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    seconds = time.perf_counter() - start
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps
    memory = (torch.cuda.max_memory_allocated() - resident) / 2**20 if device.type == "cuda" else None
    return seconds, faults, memory


def bench_config(config: str, args: argparse.Namespace, device: torch.device, peaks: dict) -> list[dict]:
    spec = CONFIGS[config]["model"]
    batch_size = args.batch_size or CONFIGS[config]["batch_size"]
    entries = contenders(device, args.variants)
    model = reference_model(spec)
    in_process = args.allocator != "shipped"
    with tempfile.TemporaryDirectory() as hf_dir:
        save_hf_pretrained(model, hf_dir, MASK_RATIO)
        steps = {}
        for c in entries if in_process else []:
            steps[c.name] = build_step(c, spec, device, hf_dir, batch_size)
            for _ in range(args.warmup):  # includes compilation for compiled variants
                steps[c.name]()
        times = {c.name: [] for c in entries}
        faults = {c.name: [] for c in entries}
        memory = {}
        for r in range(args.rounds):
            order = entries[r % len(entries) :] + entries[: r % len(entries)]
            for c in order:
                if in_process:
                    seconds, f, m = time_steps(steps[c.name], args.steps, device)
                else:
                    seconds, f, m = timed_block_in_process(c, config, args, hf_dir)
                times[c.name].append(batch_size * args.steps / seconds)
                faults[c.name].append(f)
                memory[c.name] = m
        del steps
        gc.collect()
    flops = mae_train_flops(model, batch_size, MASK_RATIO)
    hf_best = max((statistics.median(times[c.name]) for c in entries if c.impl == "hf"), default=None)
    rows = []
    for c in entries:
        ips = statistics.median(times[c.name])
        gflops = flops / batch_size * ips / 1e9
        row = dict(
            config=config,
            batch_size=batch_size,
            contender=c.name,
            impl=c.impl,
            img_s=ips,
            vs_hf_best=ips / hf_best if hf_best else None,
            gflops=gflops,
            peak_fraction=gflops / peaks[c.settings.precision],
            faults_per_step=statistics.median(faults[c.name]) if device.type == "cpu" else None,
        )
        if device.type == "cuda":
            row["memory_mib"] = memory[c.name]
        elif args.memory:
            row["memory_mib"] = cpu_peak_memory_mib(c, config, batch_size, args.allocator)
        rows.append(row)
        print(format_row(row), flush=True)
    return rows


def format_row(row: dict) -> str:
    ratio = f"{row['vs_hf_best']:.2f}x" if row["vs_hf_best"] else "-"
    memory = f"{row['memory_mib']:.0f}" if row.get("memory_mib") is not None else "-"
    faults = f"{row['faults_per_step']:.0f}" if row.get("faults_per_step") is not None else "-"
    return (
        f"| {row['config']} (batch {row['batch_size']}) | {row['contender']} | {row['img_s']:.1f} | "
        f"{ratio} | {row['gflops']:.0f} | {100 * row['peak_fraction']:.0f} % | {memory} | {faults} |"
    )


HEADER = (
    "| config | contender | img/s | vs best HF | GFLOP/s | of matmul peak | peak memory MiB "
    "| page faults/step |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|"
)


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def build_parser() -> argparse.ArgumentParser:
    """The script's options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, choices=list(CONFIGS))
    p.add_argument(
        "--variants",
        nargs="+",
        default=["peers", "default", "ablations"],
        choices=["peers", "default", "ablations"],
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-size", type=int, default=None, help="override every config's batch size")
    p.add_argument(
        "--warmup", type=int, default=2, help="untimed steps per contender (compilation happens here)"
    )
    p.add_argument("--steps", type=int, default=2, help="timed steps per contender per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--no-memory", dest="memory", action="store_false", help="skip the peak-memory measurement"
    )
    p.add_argument(
        "--allocator",
        choices=["kept", "glibc", "shipped"],
        default="kept",
        help="kept: mae.training.runtime.keep_freed_memory() for the whole process, as train.py does (every "
        "contender, Hugging Face too, runs with it); glibc: the C library's defaults; shipped: each "
        "implementation as it ships (ours kept, Hugging Face glibc), a fresh process per timed block",
    )
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    p.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)
    p.add_argument("--time-probe", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    if args.allocator == "kept":
        keep_freed_memory()
    if args.memory_probe:
        _memory_probe(args.memory_probe)
        return []
    if args.time_probe:
        _time_probe(args.time_probe)
        return []
    device = torch.device(args.device)
    peaks = {
        "fp32": matmul_peak_gflops(torch.float32, device),
        "bf16": matmul_peak_gflops(torch.bfloat16, device),
    }
    print(f"machine: {machine(device)}; allocator: {args.allocator}")
    print(f"matmul peak: fp32 {peaks['fp32']:.0f} GFLOP/s, bf16 {peaks['bf16']:.0f} GFLOP/s")
    print(HEADER, flush=True)
    rows = []
    for config in args.configs:
        rows += bench_config(config, args, device, peaks)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(device), "peaks": peaks, "rows": rows}, f, indent=2)
    return rows


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
