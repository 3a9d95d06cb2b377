"""The parts of the GPU smoke check: their order, and the time each may take.

A part is one test module, ``tests/gpu/test_<part>.py``. On the GPU a part's tests share one time limit
(pytest-timeout; the expensive run happens in the first test's setup) and need a least time left before
the script's deadline to start; the dry run on the CPU allows ``DRY_RUN_LIMIT_S`` each.
``GPU_SMOKE_LIMIT_<PART>`` / ``GPU_SMOKE_MIN_<PART>`` (seconds) replace a part's limit / least time.
"""

import os
from pathlib import Path

PARTS = (
    "throughput",
    "train_shards",
    "decoders",
    "fsdp",
    "detect",
    "onnx",
    "sigterm",
    "checkpointing",
    "fp16",
    "ema",
)
# part: (time limit on the GPU, least time left before the deadline to start it), seconds
LIMITS = {
    "throughput": (150, 60),
    "train_shards": (150, 60),
    "decoders": (90, 40),
    "fsdp": (100, 40),
    "detect": (110, 45),
    "onnx": (80, 30),
    "sigterm": (100, 40),
    "checkpointing": (60, 30),
    "fp16": (90, 40),
    "ema": (90, 40),
}
DRY_RUN_LIMIT_S, DRY_RUN_MIN_S = 240, 5


def part_of(path: Path) -> str | None:
    """The part a test file belongs to (``tests/gpu/test_fsdp.py``: ``fsdp``), or None."""
    path = Path(path)
    name = path.stem.removeprefix("test_")
    return name if name in PARTS and path.parent.name == "gpu" else None


def time_limits(part: str, dry_run: bool) -> tuple[float, float]:
    """(time limit, least time left to start) of ``part``, with the environment's overrides."""
    limit, least = (DRY_RUN_LIMIT_S, DRY_RUN_MIN_S) if dry_run else LIMITS[part]
    limit = float(os.environ.get(f"GPU_SMOKE_LIMIT_{part.upper()}", limit))
    least = float(os.environ.get(f"GPU_SMOKE_MIN_{part.upper()}", min(least, limit)))
    return limit, least


# What each part's results hold at least (the docs and results tables read these keys from <part>.json).
RESULT_KEYS = {
    "throughput": {"ours_default", "hf_best", "ours_vs_hf_best", "rows"},
    "train_shards": {"images_per_s", "decode_share", "data_wait_share", "decode_on", "steps", "standalone"},
    "decoders": {"img_s", "timed_steps_per_variant", "rows"},
    "fsdp": {"strategy", "saved_step", "final_step", "weights_equal_after_reload", "export_equals_trained"},
    "detect": {"steps", "first_loss", "last_loss", "val_map", "window_size", "global_blocks"},
    "onnx": {"trained_on", "export_check_vs_torch_cpu", "vs_encoder_on_device", "opset"},
    "sigterm": {"signalled_at_step", "exit_status", "saved_step", "resumed_from_step", "final_step"},
    "checkpointing": {"rows", "activation_saved", "time_added"},
    "fp16": {"steps", "skipped_step", "loss_scale_before", "loss_scale_after", "fused_adamw", "captured"},
    "ema": {"steps", "ema_step", "val_acc1_ema", "ema_ratio"},
}
