"""train_shards: 300 steps of ``mae pretrain`` (ViT-B/16, batch 128) from local litdata shards that ``mae
shard`` wrote from a generated folder of JPEGs, with ``data.decode_on: gpu``: images/s and the decode's share
of the step, plus the stand-alone nvJPEG rate (``benchmarks/dataloader.py``'s ``gpu_decode_rates``); dry
run: a tiny model, decoding in the loader."""

import argparse
import os
import shutil
from pathlib import Path

import pytest

from tests.gpu.callbacks import RunRecord, StepTimer, read_events, read_json
from tests.gpu.parts import LIMITS
from tests.gpu.smoke import SmokePart, callback

pytestmark = pytest.mark.timeout(LIMITS["train_shards"][0])


@pytest.fixture(scope="module")
def outputs(smoke: SmokePart) -> dict[str, str]:
    """The whole part (under the first test's time limit): shards, training from them, the stand-alone
    decode rates. The commands' outputs."""
    images, count = _jpeg_folder(smoke)
    shards = smoke.work / "shards"
    workers = "1" if smoke.dry_run else "8"
    shard_args = ("shard", str(images), "--out", str(shards), "--val-split", "", "--workers", workers)
    code, shard_output = smoke.run_mae("shard", *shard_args, "--start-method", "fork")
    smoke.results.update(images_generated=count, shard_exit_status=code)
    if code != 0:
        return {"shard": shard_output, "train": ""}
    train_output = _train(smoke, shards)
    from benchmarks.dataloader import gpu_decode_rates  # a worker reading bytes; decode + crop on the device

    batches = argparse.Namespace(
        batch_size=smoke.results["batch_size"],
        rounds=1 if smoke.dry_run else 2,
        batches=2 if smoke.dry_run else 8,
    )
    standalone = gpu_decode_rates(shards, smoke.results["img_size"], smoke.device, batches)
    smoke.results["standalone"] = {**standalone, "decode_device": smoke.device}
    return {"shard": shard_output, "train": train_output}


def _jpeg_folder(smoke: SmokePart) -> tuple[Path, int]:
    """``work/images/train/<class>/*.jpg``: photo-like JPEGs (benchmarks/dataloader.py's); on the GPU 256
    distinct 500x375 images, each hard-linked 16 times (4,096 files: 32 steps per epoch at batch 128)."""
    from benchmarks.dataloader import write_photos

    images = smoke.work / "images"
    if smoke.dry_run:
        write_photos(images / "train", 2, 8, size=(96, 72))
        return images, 16
    unique = write_photos(smoke.work / "unique" / "train", 8, 32)
    count = 0
    for path in sorted(unique.rglob("*.jpg")):
        folder = images / "train" / path.parent.name
        folder.mkdir(parents=True, exist_ok=True)
        for copy in range(16):
            _link_or_copy(path, folder / f"{path.stem}_{copy:02d}.jpg")
            count += 1
    return images, count


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _train(smoke: SmokePart, shards: Path) -> str:
    """``mae pretrain`` from the shards with the step timer; its output (the timing in the results)."""
    if smoke.dry_run:
        smoke.note(
            "dry run: data.decode_on cpu (decode_on gpu needs CUDA), the tiny model at 32 px, batch 4, 8 "
            "steps"
        )
        model = smoke.default_job_model()
        img_size, batch, steps, warmup, workers, decode_on = 32, 4, 8, 2, 0, "cpu"
    else:
        model = {"model": "mae_vit_base_patch16", "target": "norm_pix", "optim": {"warmup_epochs": 1}}
        img_size, batch, steps, warmup, workers, decode_on = 224, 128, 300, 30, 6, "gpu"
    timing, record = smoke.work / "step_timer.json", smoke.work / "run.jsonl"
    init = {
        "root": str(shards),
        "val_split": None,
        "img_size": img_size,
        "batch_size": batch,
        "num_workers": workers,
        "persistent_workers": workers > 0,
        "decode_on": decode_on,
        "cache_dir": str(smoke.work / "cache"),
    }
    data = {"class_path": "mae.data.StreamingDataModule", "init_args": init}
    callbacks = [callback(StepTimer, path=str(timing), warmup=warmup), callback(RunRecord, path=str(record))]
    config = smoke.pretrain_config("shards", model, data, callbacks, max_steps=steps, max_epochs=-1)
    config["checkpoint"] = {"save_last": False, "save_top_k": 0, "every_n_epochs": 0}
    code, output = smoke.run_mae("train", "pretrain", "--config", str(smoke.write_config("train", config)))
    end = next((e for e in read_events(record) if e["event"] == "train_end"), {})
    where = (
        "training process, nvJPEG (data.decode_on: gpu)"
        if decode_on == "gpu"
        else "loader (CPU decode; counted in data_wait_share)"
    )
    smoke.results.update(
        model=model["model"],
        img_size=img_size,
        batch_size=batch,
        loader_workers=workers,
        decode_on=decode_on,
        decode_where=where,
        expected_steps=steps,
        steps=end.get("step"),
        train_exit_status=code,
        **(read_json(timing) or {}),
    )
    return output


def test_mae_shard_writes_the_shards(outputs: dict[str, str], smoke: SmokePart) -> None:
    code = smoke.results["shard_exit_status"]
    assert code == 0, f"mae shard exited with {code}: {outputs['shard'][-1500:]}"


def test_mae_pretrain_trains_from_the_shards(outputs: dict[str, str], smoke: SmokePart) -> None:
    results = smoke.results
    code = results.get("train_exit_status")
    assert code == 0, f"mae pretrain exited with {code}: {outputs['train'][-1500:]}"
    assert results["steps"] == results["expected_steps"], f"trained {results['steps']} steps"


def test_the_steps_are_timed_on_the_device(outputs: dict[str, str], smoke: SmokePart) -> None:
    results = smoke.results
    assert "images_per_s" in results, f"no step timing ({results.get('error', 'StepTimer wrote nothing')})"
    assert results["device"].startswith(smoke.device), f"trained on {results['device']}"


def test_the_standalone_decode_rates_are_measured(outputs: dict[str, str], smoke: SmokePart) -> None:
    rates = smoke.results.get("standalone", {})
    assert rates.get("encoded_worker", 0) > 0 and rates.get("device_decode", 0) > 0, rates


def test_it_records_the_results_and_logs(outputs: dict[str, str], smoke: SmokePart) -> None:
    """The results the docs read, and each command's log."""
    assert not smoke.missing_records("shard", "train"), smoke.missing_records("shard", "train")
