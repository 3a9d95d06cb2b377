"""benchmarks/gpu_smoke.sh --dry-run: every part of the GPU smoke check walked on the CPU with tiny sizes, its
JSON, logs and summary; and a part that outlives its time limit (killed with what it started, status
"timeout") while the next part still runs, and a part skipped for want of budget."""

import json
import os
import subprocess
import time

import pytest

from benchmarks.gpu_smoke import group_alive
from tests.helpers import REPO

SCRIPT = REPO / "benchmarks" / "gpu_smoke.sh"
PARTS = ["throughput", "train_shards", "decoders", "fsdp", "detect", "onnx", "sigterm"]
DECODER_VARIANTS = {"default", "partial-0.25", "partial-0.5", "cross", "cross-partial-0.25", "low-res", "fast"}
RECORD_KEYS = {"part", "status", "seconds", "limit_s", "dry_run", "device", "results", "notes", "error", "log"}
RESULT_KEYS = {
    "throughput": {"ours_default", "hf_best", "ours_vs_hf_best", "rows"},
    "train_shards": {"images_per_s", "decode_share", "data_wait_share", "decode_on", "steps", "standalone"},
    "decoders": {"img_s", "timed_steps_per_variant", "rows"},
    "fsdp": {"strategy", "saved_step", "resumed_from_step", "final_step", "weights_equal_after_reload"},
    "detect": {"steps", "first_loss", "last_loss", "val_map", "window_size", "global_blocks"},
    "onnx": {"trained_on", "export_check_vs_torch_cpu", "vs_encoder_on_device", "opset"},
    "sigterm": {"signalled_at_step", "exit_status", "saved_step", "resumed_from_step", "final_step"},
}


def _run(out, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_SMOKE_", "DRY_RUN", "PARTS"))}
    environment.update(env)
    start = time.monotonic()
    result = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out), *args], cwd=REPO, env=environment,
                            capture_output=True, text=True, timeout=280)  # fmt: skip
    return result, time.monotonic() - start


def _read(out, name: str) -> dict:
    return json.loads((out / name).read_text())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dry_run__every_part_ok_with_its_json_log_and_summary(tmp_path):
    out = tmp_path / "results"
    result, seconds = _run(out)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    summary = _read(out, "summary.json")
    assert summary["dry_run"] and summary["all_ok"], summary
    assert [p["part"] for p in summary["parts"]] == PARTS
    assert all(p["status"] == "ok" and p["seconds"] > 0 for p in summary["parts"]), summary["parts"]
    assert summary["counts"] == {"ok": 7, "failed": 0, "timeout": 0, "skipped": 0}
    assert (out / "machine.txt").read_text().count("torch") >= 1
    for part in PARTS:
        record = _read(out, f"{part}.json")
        assert RECORD_KEYS <= set(record), (part, record)
        assert record["status"] == "ok" and record["error"] is None, (part, record["error"])
        assert record["dry_run"] and record["device"] == "cpu" and record["exit_status"] == 0
        assert 0 < record["seconds"] <= record["limit_s"]
        assert RESULT_KEYS[part] <= set(record["results"]), (part, sorted(record["results"]))
        assert record["results"]["checks_failed"] == []
        assert (out / f"{part}.log").read_text().startswith(f"== {part}")
    results = {part: _read(out, f"{part}.json")["results"] for part in PARTS}
    assert results["throughput"]["ours_default"]["img_s"] > 0 and results["throughput"]["hf_best"]["img_s"] > 0
    assert results["train_shards"]["decode_on"] == "cpu" and results["train_shards"]["steps"] == 8
    assert any("decode_on cpu" in note for note in _read(out, "train_shards.json")["notes"])
    assert set(results["decoders"]["img_s"]) == DECODER_VARIANTS
    fsdp = results["fsdp"]
    assert fsdp["strategy"] == "auto" and any("FSDP" in note for note in _read(out, "fsdp.json")["notes"])
    assert fsdp["weights_equal_after_reload"] and fsdp["checkpoint_equals_trained"]
    assert fsdp["saved_step"] == fsdp["resumed_from_step"] == 3 and fsdp["final_step"] == 5
    assert results["detect"]["steps"] == 2 and results["detect"]["val_map"] is not None
    assert results["onnx"]["trained_on"] == "cpu" and results["onnx"]["vs_encoder_on_device"]
    sigterm = results["sigterm"]
    assert sigterm["exit_status"] == 143 and sigterm["exception"] == "SIGTERMException"
    assert sigterm["signalled_at_step"] <= sigterm["saved_step"] <= sigterm["signalled_at_step"] + 1
    assert sigterm["resumed_from_step"] == sigterm["saved_step"] and sigterm["final_step"] == 6
    for log in ("train_shards.shard", "train_shards.train", "fsdp.first", "fsdp.resume", "detect.detect",
                "sigterm.first", "sigterm.resume"):  # fmt: skip
        assert (out / f"{log}.log").stat().st_size > 0, log
    print(f"dry run: {seconds:.1f} s")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_dry_run__a_part_over_its_limit_times_out_the_next_runs_one_without_budget_is_skipped(tmp_path):
    out = tmp_path / "results"
    result, _ = _run(out, "--parts", "sigterm decoders onnx", GPU_SMOKE_LIMIT_SIGTERM="3",
                     GPU_SMOKE_MIN_ONNX="100000")  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    summary = _read(out, "summary.json")
    statuses = {p["part"]: p["status"] for p in summary["parts"]}
    assert statuses == {"decoders": "ok", "onnx": "skipped", "sigterm": "timeout"}, output[-4000:]
    assert summary["counts"] == {"ok": 1, "failed": 0, "timeout": 1, "skipped": 1} and not summary["all_ok"]
    timed_out = _read(out, "sigterm.json")
    assert timed_out["status"] == "timeout" and timed_out["limit_s"] == 3
    assert 3 <= timed_out["seconds"] < 20 and "time limit of 3 s" in timed_out["error"]
    assert not group_alive(timed_out["pgid"])  # the part and the train.py it had started are gone
    skipped = _read(out, "onnx.json")
    assert skipped["status"] == "skipped" and "needs at least 100000 s" in skipped["error"]
    assert "skipped" in (out / "onnx.log").read_text()
    assert _read(out, "decoders.json")["status"] == "ok"
