"""fsdp: ``mae pretrain`` with ``trainer.strategy: fsdp`` on one GPU for a few steps, then ``--ckpt_path``
resume: the checkpoint holds the trained weights, the reload restores them, and the run continues from the
saved step (dry run: the default strategy, since Lightning's FSDP needs CUDA)."""

import shutil

import pytest
import torch

from tests.gpu.callbacks import RunRecord, differing, read_events, state_digest
from tests.gpu.parts import LIMITS
from tests.gpu.smoke import SmokePart, callback

pytestmark = pytest.mark.timeout(LIMITS["fsdp"][0])


@pytest.fixture(scope="module")
def runs(smoke: SmokePart) -> dict:
    """The first run and its resumed continuation; their records by event, the saved checkpoint's state."""
    first, total = (3, 5) if smoke.dry_run else (6, 10)
    strategy = "auto" if smoke.dry_run else "fsdp"
    if smoke.dry_run:
        smoke.note(
            "dry run: Lightning's FSDP needs CUDA; the same save / load / resume check with the default "
            "strategy"
        )
    record = smoke.work / "run.jsonl"
    data = smoke.digits(32, 8 if smoke.dry_run else 64)
    callbacks = [callback(RunRecord, path=str(record), digest=True)]
    config = smoke.pretrain_config(
        "fsdp", smoke.default_job_model(), data, callbacks, max_steps=first, max_epochs=-1, strategy=strategy
    )
    config["checkpoint"] = {"dirpath": str(smoke.work / "ckpts"), "save_last": True, "save_top_k": 0}
    path = smoke.write_config("fsdp", config)
    last, saved = smoke.work / "ckpts" / "last.ckpt", smoke.work / "saved_first.ckpt"
    code1, out1 = smoke.run_mae("first", "pretrain", "--config", str(path))
    code2, out2 = None, ""
    if code1 == 0 and last.exists():
        shutil.copyfile(last, saved)  # the resumed run overwrites last.ckpt
        resume = ("--trainer.max_steps", str(total), "--ckpt_path", str(last))
        code2, out2 = smoke.run_mae("resume", "pretrain", "--config", str(path), *resume)
    starts = [e for e in read_events(record) if e["event"] == "train_start"]
    ends = [e for e in read_events(record) if e["event"] == "train_end"]
    smoke.results.update(
        strategy=strategy,
        precision=smoke.precision,
        first_run_steps=first,
        resumed_to=total,
        exit_status=[code1, code2],
        trained_on=starts[0]["device"] if starts else None,
        strategy_class=starts[0]["strategy"] if starts else None,
    )
    runs = {"first": (code1, out1), "resume": (code2, out2), "starts": starts, "ends": ends}
    if saved.exists():
        runs["file"] = torch.load(saved, map_location="cpu", weights_only=True, mmap=True)
        runs["file_digest"] = state_digest(runs["file"]["state_dict"])
        smoke.results.update(
            saved_step=runs["file"]["global_step"],
            tensors=len(runs["file_digest"]),
            checkpoint_mb=saved.stat().st_size / 2**20,
        )
    if len(starts) == 2 and len(ends) == 2:
        smoke.results.update(
            first_run_end_step=ends[0]["step"],
            resumed_from_step=starts[1]["step"],
            resumed_batches=ends[1]["batches"],
            final_step=ends[1]["step"],
            weights_equal_after_reload=not differing(ends[0]["digest"], starts[1]["digest"]),
            checkpoint_equals_trained=not differing(ends[0]["digest"], runs.get("file_digest", {})),
        )
    return runs


def test_the_first_run_saves_last_ckpt_and_the_resumed_run_ends_well(runs: dict) -> None:
    code, out = runs["first"]
    assert code == 0 and "file" in runs, (
        f"first run: exit status {code}, last.ckpt missing or not: {out[-1500:]}"
    )
    code, out = runs["resume"]
    assert code == 0, f"resumed run exited with {code}: {out[-1500:]}"
    assert len(runs["starts"]) == len(runs["ends"]) == 2, "the runs' records are incomplete"


def test_it_ran_with_fsdp_on_the_device(runs: dict, smoke: SmokePart) -> None:
    expected = "SingleDeviceStrategy" if smoke.dry_run else "FSDPStrategy"
    ran = (smoke.results["strategy_class"], smoke.results["trained_on"])
    assert ran[0] == expected and str(ran[1]).startswith(smoke.device), f"ran with {ran}, not {expected}"


def test_last_ckpt_holds_the_trained_weights(runs: dict) -> None:
    different = differing(runs["ends"][0]["digest"], runs["file_digest"])
    assert not different, f"last.ckpt differs from the trained weights: {different[:5]}"


def test_the_weights_after_the_reload_equal_those_saved(runs: dict) -> None:
    different = differing(runs["ends"][0]["digest"], runs["starts"][1]["digest"])
    assert not different, f"weights after the reload differ: {different[:5]}"


def test_the_resumed_run_continues_from_the_saved_step_to_the_end(runs: dict, smoke: SmokePart) -> None:
    first, total = smoke.results["first_run_steps"], smoke.results["resumed_to"]
    steps = [runs["file"]["global_step"], runs["ends"][0]["step"], runs["starts"][1]["step"]]
    assert steps == [first] * 3, (
        f"steps saved, at the first run's end, at the resume: {steps}, expected {first}"
    )
    ended = (runs["ends"][1]["step"], runs["ends"][1]["batches"])
    assert ended == (total, total - first), f"the resumed run ended at (step, batches) {ended}"


def test_it_records_the_results_and_logs(runs: dict, smoke: SmokePart) -> None:
    """The results the docs read, and each command's log."""
    assert not smoke.missing_records("first", "resume"), smoke.missing_records("first", "resume")
