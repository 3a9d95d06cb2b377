"""What the weight EMA of ``mae finetune --ema.decay`` costs per step: a ViT-B/16 fine-tuning step (forward,
backward, fused-or-not AdamW as the run picks it) with and without timm's ``ModelEmaV3`` update after it,
in the same process, rounds interleaved so a slow moment of the machine falls on both.

    python benchmarks/ema_cost.py                                   # ViT-B/16, 224 px, batch 2, CPU
    python benchmarks/ema_cost.py --device cuda --batch 64 --out benchmarks/results/ema_cost_gpu.json

Nothing is asserted: the numbers go in docs/performance.md (read from the results file).
"""

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import timm
import torch
from timm.utils import ModelEmaV3

REPO = Path(__file__).resolve().parents[1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(model_name: str, img_size: int, batch: int, steps: int, device: torch.device) -> dict:
    """Median seconds of a training step without and with the EMA update, and of the update alone."""
    torch.manual_seed(0)
    model = timm.create_model(model_name, img_size=img_size, num_classes=1000, global_pool="avg").to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    ema = ModelEmaV3(model, decay=0.9999)
    imgs = torch.randn(batch, 3, img_size, img_size, device=device)
    targets = torch.randint(0, 1000, (batch,), device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step(with_ema: bool) -> tuple[float, float]:
        start = time.perf_counter()
        with autocast:
            loss = torch.nn.functional.cross_entropy(model(imgs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        stepped = time.perf_counter()
        if with_ema:
            ema.update(model, step=2)
            _sync(device)
        end = time.perf_counter()
        return end - start, end - stepped

    step(True)  # warm-up: allocations, optimizer state
    plain, with_ema, update = [], [], []
    for _ in range(steps):
        plain.append(step(False)[0])
        total, alone = step(True)
        with_ema.append(total)
        update.append(alone)
    params = sum(p.numel() for p in model.parameters())
    return {
        "model": model_name,
        "img_size": img_size,
        "batch": batch,
        "steps": steps,
        "parameters_M": round(params / 1e6, 1),
        "step_s": round(statistics.median(plain), 4),
        "step_with_ema_s": round(statistics.median(with_ema), 4),
        "ema_update_ms": round(1000 * statistics.median(update), 2),
        "ema_ratio": round(statistics.median(with_ema) / statistics.median(plain), 3),
        "ema_update_share_pct": round(100 * statistics.median(update) / statistics.median(plain), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    args = parser.parse_args()
    device = torch.device(args.device)
    result = measure(args.model, args.img_size, args.batch, args.steps, device)
    cpu = f"cpu {platform.machine()}, {torch.get_num_threads()} threads"
    result["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
