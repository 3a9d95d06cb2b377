#!/usr/bin/env bash
# The GPU check of issue 7, as one short script: ViT-B/16 MAE pretraining at batch 256 on one GPU, ours
# vs Hugging Face's ViTMAE, interleaved (benchmarks/throughput.py), plus ViT-Tiny/16, the CIFAR-size
# model and ours alone on ViT-L/16; and issue 19's input check: loader workers per GPU with JPEGs decoded
# in the workers vs data.decode_on: gpu (benchmarks/dataloader.py --decode-device, dataloader.json); and issue 28's
# decoder variants (partial reconstruction, the cross decoder, low resolution, the fast recipe): ViT-B/16 step
# throughput of each at batch 256, interleaved (benchmarks/time_to_quality.py --throughput-only, decoder_variants.json).
# Results go to $OUT (default ./gpu_results): one JSON file per config,
# machine.txt and run.log. docs/performance.md shows the H200 results (benchmarks/results/throughput_h200.json).
#
#     bash benchmarks/gpu_check.sh            # about 9.5 minutes on an H200, most of it compiling
#
# A preflight first checks that our bf16 step runs with PyTorch's flash-attention kernel forced and that
# torch.compile works on this machine; if compilation fails, the compiled variants are left out.
set -u -o pipefail
OUT=${OUT:-gpu_results}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu BATCH=2 STEPS=1 ROUNDS=1 dry-runs the script
DEADLINE=${DEADLINE:-570}  # seconds: later configs are cut short or skipped to end by then
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/machine.txt"
python3 -c "import torch, timm, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'timm', timm.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/machine.txt"

variants="peers default ablations"
if ! timeout 180 python3 - "$DEVICE" <<'EOF' 2>&1 | tee -a "$OUT/run.log"; then
import sys, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from mae.models import create_model
from mae.training.runtime import set_attention_kernel, training_settings

device = sys.argv[1]
settings = training_settings(device)
print(f"default settings on {device}:", settings.describe())
model = create_model("mae_vit_base_patch16", norm_pix_loss=True).to(device)
imgs = torch.randn(8, 3, 224, 224, device=device)
backend = SDPBackend.FLASH_ATTENTION if device == "cuda" else SDPBackend.MATH
with sdpa_kernel([backend]), torch.autocast(device, dtype=torch.bfloat16):
    loss = model(imgs, 0.75)[0]
loss.backward()
print(f"{backend.name} attention forward + backward: loss", loss.item())
compiled = set_attention_kernel(create_model("mae_vit_tiny_patch4", img_size=32).to(device), settings.attention)
compiled.compile()  # in place, as training compiles (MAETrainingModule.on_fit_start)
with torch.autocast(device, dtype=torch.bfloat16):
    compiled(torch.randn(8, 3, 32, 32, device=device), 0.75)[0].backward()
print("torch.compile: ok")
EOF
    echo "preflight failed: running without the compiled variants" | tee -a "$OUT/run.log"
    variants="peers"
fi

# config, batch size, seconds allowed at most, variants, rounds, steps; skipped when the deadline is near
bench() {
    local allowed=$(( DEADLINE - SECONDS < $3 ? DEADLINE - SECONDS : $3 ))
    if (( allowed < 40 )); then echo "skipped $1: ${allowed}s left before the deadline" | tee -a "$OUT/run.log"; return; fi
    timeout "$allowed" python3 benchmarks/throughput.py --device "$DEVICE" --configs "$1" \
        --batch-size "${BATCH:-$2}" --variants $4 --warmup 3 --rounds "${ROUNDS:-$5}" --steps "${STEPS:-$6}" \
        --no-memory --json "$OUT/$1.json" 2>&1 | tee -a "$OUT/run.log"
}
# Input pipeline first (about a minute): per-worker img/s decoding on the CPU vs reading bytes only, nvJPEG
# batch decode + crop on the GPU, and the workers a GPU needs at the ViT-B/16 rate measured below.
timeout 120 python3 benchmarks/dataloader.py --decode-device "$DEVICE" --img-sizes 224 --rounds "${ROUNDS:-3}" \
    --batches "${STEPS:-12}" --json "$OUT/dataloader.json" 2>&1 | grep -v "it/s" | tee -a "$OUT/run.log"
bench base224 256 330 "$variants" 5 10
# Issue 28's decoder variants on ViT-B/16 (224 px; low-res 112, fast 160): bf16 + SDPA + fused AdamW, not compiled
# (each compilation would cost ~40 s), so compare them with each other and with "ours bf16 + sdpa + fused AdamW".
allowed=$(( DEADLINE - SECONDS < 120 ? DEADLINE - SECONDS : 120 ))
if (( allowed < 40 )); then echo "skipped decoder variants: ${allowed}s left before the deadline" | tee -a "$OUT/run.log"
else
    timeout "$allowed" python3 benchmarks/time_to_quality.py --throughput-only --device "$DEVICE" \
        --model mae_vit_base_patch16 --img-size 224 --batch-size "${BATCH:-256}" --warmup 3 --steps "${STEPS:-10}" \
        --rounds "${ROUNDS:-3}" --json "$OUT/decoder_variants.json" 2>&1 | tee -a "$OUT/run.log"
fi
bench cifar 128 130 "$variants" 5 10
bench tiny224 256 130 "${variants% ablations}" 3 10  # each compiled variant costs ~40 s more
bench large224 256 110 default 3 5
echo "finished after ${SECONDS}s" | tee -a "$OUT/run.log"
