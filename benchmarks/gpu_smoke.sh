#!/usr/bin/env bash
# The GPU smoke check, as one command of at most 8 minutes on one H200 (installs included): every GPU-only
# path run once, briefly, as the pytest tests of tests/gpu (one module per part, each under its own time
# limit: tests/gpu/parts.py). Parts: throughput (ViT-B/16 bf16 step, ours vs Hugging Face's best),
# train_shards (300 steps of mae pretrain from litdata shards, data.decode_on: gpu), decoders (every decoder
# switch, 50 steps each), fsdp (FSDP2, --config strategy/fsdp, bf16: sharded save, resume, mae export of the
# sharded checkpoint; the dry run runs FSDP2 on the CPU), detect (mae detect with
# the COCO ViTDet recipe's model, bf16, 30 steps), onnx (a GPU-trained encoder exported and checked with
# onnxruntime), sigterm (SIGTERM mid-step of mae pretrain, then --ckpt_path last), checkpointing (ViT-L/16 bf16
# pretraining step, peak memory and step time without and with model.grad_checkpointing), fp16 (mae pretrain
# with trainer.precision 16-mixed, fused AdamW and checkpointing, one step skipped by the loss scaler), ema
# (mae finetune --ema.decay, bf16: val/acc1_ema and the saved average; the EMA update's cost per step).
#
#     bash benchmarks/gpu_smoke.sh                          # on the GPU machine (OUT is relative to the current folder)
#     bash benchmarks/gpu_smoke.sh --dry-run                # every part on the CPU with tiny sizes (~2 minutes)
#     bash benchmarks/gpu_smoke.sh --parts "fsdp sigterm"   # some parts only
#
# Results in $OUT (default ./gpu_smoke_results): <part>.json (status ok / failed / timeout / skipped, seconds,
# limit_s, results, notes, error) and <part>.log (plus <part>.<run>.log for each mae command it ran),
# summary.json (every part's status and seconds), machine.txt, install.log and run.log.
# Environment: OUT, BUDGET (seconds for the parts' deadline from the script's start, default 455, so that
# the last part and the summary end within 8 minutes; dry run 600), DRY_RUN=1, PARTS,
# GPU_SMOKE_LIMIT_<PART> / GPU_SMOKE_MIN_<PART> (a part's time limit / the least time left to start it).
# Exit status 0 when every part is ok.
set -u -o pipefail
START=$(date +%s)
DRY_RUN=${DRY_RUN:-0}
PARTS=${PARTS:-}
OUT=${OUT:-gpu_smoke_results}
while (($#)); do
    case $1 in
        --dry-run) DRY_RUN=1 ;;
        --parts) PARTS=${2:?--parts needs a list}; shift ;;
        --parts=*) PARTS=${1#--parts=} ;;
        --out) OUT=${2:?--out needs a folder}; shift ;;
        --out=*) OUT=${1#--out=} ;;
        -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_smoke.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
ALL_PARTS="throughput train_shards decoders fsdp detect onnx sigterm checkpointing fp16 ema"
for part in $PARTS; do
    [[ " $ALL_PARTS " == *" $part "* ]] || { echo "gpu_smoke.sh: unknown part $part (parts: $ALL_PARTS)" >&2; exit 2; }
done
[[ $DRY_RUN == 1 ]] && BUDGET=${BUDGET:-600} || BUDGET=${BUDGET:-455}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_NVML_BASED_CUDA_CHECK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
: > "$OUT/run.log"
log() { echo "$*" | tee -a "$OUT/run.log"; }

# 1. Installs only when a package is missing (the check imports nothing), at most 150 s.
missing=$(python3 - <<'EOF'
import importlib.util
names = ["mae", "pytest", "pytest_timeout", "lightning", "litdata", "transformers", "onnx", "onnxscript", "onnxruntime",
         "pycocotools"]
print(" ".join(n for n in names if importlib.util.find_spec(n) is None))
EOF
)
if [[ -z $missing ]]; then
    echo "every package imports: no install" > "$OUT/install.log"
elif [[ $DRY_RUN == 1 ]]; then
    log "missing: $missing (the dry run installs nothing; the parts that need them fail)"
else
    log "missing: $missing; pip install -e .[dev,onnx,dense,embed] (at most 150 s)"
    timeout 150 python3 -m pip install -e ".[dev,onnx,dense,embed]" > "$OUT/install.log" 2>&1 \
        || log "pip install failed or ran out of time (exit $?): see install.log"
fi

# 2. The machine: GPU, driver, versions.
{
    echo "date: $(date -Is)   host: $(hostname)   dry run: $DRY_RUN"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || echo "no nvidia-smi"
    python3 - <<'EOF'
import importlib.metadata as metadata
import platform
print("python", platform.python_version(), platform.machine())
for name in ["torch", "torchvision", "timm", "lightning", "transformers", "litdata", "onnx", "onnxscript",
             "onnxruntime", "pycocotools", "mae-lightning"]:
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        print(name, "not installed")
EOF
    if [[ $DRY_RUN != 1 ]]; then
        timeout 60 python3 -c "import torch; print('torch cuda', torch.version.cuda, 'cudnn',
torch.backends.cudnn.version(), 'device', torch.cuda.get_device_name(), torch.cuda.get_device_capability())"
    fi
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" >> "$OUT/run.log"

# 3. The parts: the tests of tests/gpu, on the GPU (-m gpu) or their dry run (-m "not gpu"), in the order
# of ALL_PARTS; a part that no longer fits before the deadline is skipped; the outer timeout is a last resort.
files=()
for part in $ALL_PARTS; do
    [[ -z $PARTS || " $PARTS " == *" $part "* ]] && files+=("tests/gpu/test_$part.py")
done
[[ $DRY_RUN == 1 ]] && select="not gpu" || select="gpu"
left=$((START + BUDGET + 15 - $(date +%s)))
timeout -k 5 "$left" python3 -m pytest -p tests.gpu.results --json-out "$OUT" --smoke-deadline $((START + BUDGET)) \
    -m "$select" -q -rA --basetemp "$OUT/work" "${files[@]}" 2>&1 | tee -a "$OUT/run.log"
status=${PIPESTATUS[0]}
[[ -f $OUT/summary.json ]] || log "no summary.json: pytest ended early (exit $status)"
log "gpu_smoke.sh: exit $status after $(($(date +%s) - START)) s; results in $OUT (summary.json)"
exit "$status"
