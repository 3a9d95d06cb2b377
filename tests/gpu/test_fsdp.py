"""fsdp: ``mae pretrain --config strategy/fsdp`` (FSDP2: ``mae.training.sharding.FSDP2Strategy``) on one GPU
in bf16-mixed for a few steps, saving a sharded checkpoint (a folder of shards); ``--ckpt_path`` resumes from
it to the end; ``mae export`` reads the resumed run's sharded checkpoint as it is. The saved shards hold the
trained weights in fp32 (FSDP2 computes with bf16 copies), the reload restores them, the run continues from
the saved step and the exported encoder is the trained one. Dry run: the same on the CPU (one process,
gloo, 32-true), where FSDP2 runs too."""

import shutil

import pytest
from safetensors.torch import load_file

from mae.convert.sharded_checkpoint import is_sharded_checkpoint, read_sharded_checkpoint
from tests.gpu.callbacks import RunRecord, differing, read_events, state_digest
from tests.gpu.parts import LIMITS
from tests.gpu.smoke import SmokePart, callback

pytestmark = pytest.mark.timeout(LIMITS["fsdp"][0])

RECIPE = "strategy/fsdp"  # the stackable recipe users stack on theirs
STRATEGY = "FSDP2Strategy"
MODEL_PREFIX = "model."  # the trained network's entries in the training state dict


@pytest.fixture(scope="module")
def runs(smoke: SmokePart) -> dict:
    """The first run, its resumed continuation and the export of the resumed run's checkpoint: their records
    by event, the first run's saved checkpoint and the exported encoder."""
    first, total = (2, 4) if smoke.dry_run else (6, 10)
    if smoke.dry_run:
        smoke.note("dry run: FSDP2 on the CPU, one process (gloo), 32-true, the tiny model")
    record = smoke.work / "run.jsonl"
    data = smoke.digits(32, 8 if smoke.dry_run else 64)
    callbacks = [callback(RunRecord, path=str(record), digest=True)]
    config = smoke.pretrain_config(
        "fsdp", smoke.default_job_model(), data, callbacks, max_steps=first, max_epochs=-1
    )
    config["checkpoint"] = {"dirpath": str(smoke.work / "ckpts"), "save_last": True, "save_top_k": 0}
    command = ("pretrain", "--config", str(smoke.write_config("fsdp", config)), "--config", RECIPE)
    last, saved = smoke.work / "ckpts" / "last.ckpt", smoke.work / "saved_first.ckpt"
    encoder = smoke.work / "encoder.safetensors"
    code1, out1 = smoke.run_mae("first", *command)
    code2, out2, code3, out3 = None, "", None, ""
    if code1 == 0 and is_sharded_checkpoint(last):
        shutil.copytree(last, saved)  # the resumed run replaces last.ckpt
        resume = ("--trainer.max_steps", str(total), "--ckpt_path", str(last))
        code2, out2 = smoke.run_mae("resume", *command, *resume)
    if code2 == 0:
        code3, out3 = smoke.run_mae("export", "export", "--checkpoint", str(last), "--out", str(encoder))
    events = read_events(record)
    starts = [e for e in events if e["event"] == "train_start"]
    ends = [e for e in events if e["event"] == "train_end"]
    smoke.results.update(
        strategy=starts[0]["strategy"] if starts else None,
        precision=smoke.precision,
        first_run_steps=first,
        resumed_to=total,
        exit_status=[code1, code2, code3],
        trained_on=starts[0]["device"] if starts else None,
    )
    runs = {"first": (code1, out1), "resume": (code2, out2), "export": (code3, out3)}
    runs.update(starts=starts, ends=ends)
    if is_sharded_checkpoint(saved):
        runs["file"] = read_sharded_checkpoint(saved, model_only=True)
        runs["file_digest"] = state_digest(runs["file"]["state_dict"])
        smoke.results.update(
            checkpoint="sharded",
            saved_step=runs["file"]["global_step"],
            shard_files=len(list(saved.glob("*.distcp"))),
            saved_dtypes=sorted({str(t.dtype) for t in runs["file"]["state_dict"].values()}),
            tensors=len(runs["file_digest"]),
            checkpoint_mb=sum(f.stat().st_size for f in saved.iterdir()) / 2**20,
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
    if code3 == 0 and encoder.is_file() and len(ends) == 2:
        runs["encoder"] = _differing_from_trained(state_digest(load_file(encoder)), ends[1]["digest"])
        smoke.results.update(
            exported_tensors=len(runs["encoder"][0]), export_equals_trained=not runs["encoder"][1]
        )
    return runs


def _differing_from_trained(exported: dict[str, str], trained: dict[str, str]) -> tuple[list[str], list[str]]:
    """(the exported encoder's tensor names, those that differ from the trained network's tensor of that
    name or that it lacks)."""
    return sorted(exported), sorted(n for n in exported if trained.get(MODEL_PREFIX + n) != exported[n])


def test_the_first_run_saves_a_sharded_last_ckpt_and_the_resumed_run_ends_well(runs: dict) -> None:
    code, out = runs["first"]
    assert code == 0 and "file" in runs, (
        f"first run: exit status {code}, no sharded last.ckpt folder or not: {out[-1500:]}"
    )
    code, out = runs["resume"]
    assert code == 0, f"resumed run exited with {code}: {out[-1500:]}"
    assert len(runs["starts"]) == len(runs["ends"]) == 2, "the runs' records are incomplete"


def test_it_ran_with_fsdp2_on_the_device(runs: dict, smoke: SmokePart) -> None:
    ran = (smoke.results["strategy"], smoke.results["trained_on"], runs["starts"][0]["precision"])
    assert ran[0] == STRATEGY and str(ran[1]).startswith(smoke.device), f"ran with {ran}, not {STRATEGY}"
    assert ran[2] == smoke.precision, f"ran in {ran[2]}, not {smoke.precision}"


def test_the_shards_hold_the_trained_weights_in_fp32(runs: dict, smoke: SmokePart) -> None:
    """Under bf16-mixed FSDP2 keeps fp32 weights and computes with bf16 copies: the saved ones are fp32."""
    assert smoke.results["shard_files"] >= 1 and smoke.results["saved_dtypes"] == ["torch.float32"], (
        smoke.results
    )
    different = differing(runs["ends"][0]["digest"], runs["file_digest"])
    assert not different, f"the sharded last.ckpt differs from the trained weights: {different[:5]}"


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


def test_mae_export_reads_the_sharded_checkpoint_and_writes_the_trained_encoder(runs: dict) -> None:
    code, out = runs["export"]
    assert code == 0 and "encoder" in runs, f"mae export exited with {code}: {out[-1500:]}"
    names, different = runs["encoder"]
    assert any(name.startswith("blocks.") for name in names), names[:10]
    assert not different, f"exported tensors differ from the trained network's: {different[:5]}"


def test_it_records_the_results_and_logs(runs: dict, smoke: SmokePart) -> None:
    """The results the docs read, and each command's log."""
    missing = smoke.missing_records("first", "resume", "export")
    assert not missing, missing
