"""sigterm: SIGTERM in the middle of a training step of ``mae pretrain`` (between forward and backward, the
forward's kernels queued on the GPU), then ``--ckpt_path last``: exit status 143, a checkpoint at that step,
and the resumed run continues from it to the end."""

import signal
import time

import pytest
import torch

from tests.gpu.callbacks import MidStepPause, RunRecord, read_events, read_json
from tests.gpu.parts import LIMITS
from tests.gpu.smoke import SmokePart, callback

pytestmark = pytest.mark.timeout(LIMITS["sigterm"][0])


@pytest.fixture(scope="module")
def runs(smoke: SmokePart) -> dict:
    """The whole part (under the first test's time limit): the signalled run, then its resumption when it
    left a checkpoint. Their outputs, and last.ckpt."""
    signalled = _run_and_signal(smoke)
    if signalled["last"] is not None:
        signalled["resumed_output"] = _resume(smoke, signalled)
    return signalled


def _run_and_signal(smoke: SmokePart) -> dict:
    """The run signalled mid-step: its exit status, output, records; the moment it was signalled."""
    signal_step, total, pause = (2, 6, 1.5) if smoke.dry_run else (10, 30, 3.0)
    if smoke.dry_run:
        smoke.note("dry run: the tiny model on the CPU (the step is a CPU step)")
    record, marker = smoke.work / "run.jsonl", smoke.work / "mid_step.json"
    callbacks = [
        callback(RunRecord, path=str(record)),
        callback(MidStepPause, step=signal_step, marker=str(marker), seconds=pause),
    ]
    data = smoke.digits(32, 8 if smoke.dry_run else 64)
    config = smoke.pretrain_config(
        "preempt", smoke.default_job_model(), data, callbacks, max_steps=total, max_epochs=-1
    )
    config["checkpoint"] = {"save_top_k": 0}
    command = ("pretrain", "--config", str(smoke.write_config("preempt", config)))
    smoke.results["total_steps"] = total
    with smoke.start_mae("first", *command) as child:
        smoke.results["first_run_pid"] = child.pid
        paused = _signal_when_paused(child, marker)
        code = child.wait()
    output = smoke.log("first").read_text(errors="replace")
    events = read_events(record)
    saves = [e["step"] for e in events if e["event"] == "save"]
    smoke.results.update(
        signalled_at_step=paused and paused["step"],
        signalled_device=paused and paused["device"],
        exit_status=code,
        sigterm_message="SIGTERM: saved" in output,
        exception=next((e["type"] for e in events if e["event"] == "exception"), None),
        saved_step=saves[-1] if saves else None,
    )
    last = next(iter(sorted((smoke.work / "runs" / "preempt").glob("*/checkpoints/last.ckpt"))), None)
    return {"command": command, "output": output[-1500:], "last": last, "record": record}


def _signal_when_paused(child, marker) -> dict | None:
    """SIGTERM to the training process alone (as ``kill PID``) once it pauses mid-step; the pause's record."""
    while child.poll() is None:
        paused = read_json(marker)
        if paused:
            child.send_signal(signal.SIGTERM)
            return paused
        time.sleep(0.05)
    return None


def _resume(smoke: SmokePart, signalled: dict) -> str:
    """``--ckpt_path last`` after the signal: its output; its exit status and records in the results."""
    saved_step = torch.load(signalled["last"], map_location="cpu", weights_only=True, mmap=True)[
        "global_step"
    ]
    code, output = smoke.run_mae("resume", *signalled["command"], "--ckpt_path", "last")
    events = read_events(signalled["record"])
    start = ([e for e in events if e["event"] == "train_start"][1:2] or [{}])[0]
    end = ([e for e in events if e["event"] == "train_end"] or [{}])[-1]
    smoke.results.update(
        resume_exit_status=code,
        checkpoint=str(signalled["last"]),
        checkpoint_step=saved_step,
        resumed_from_step=start.get("step"),
        resumed_batches=end.get("batches"),
        final_step=end.get("step"),
        resumed_device=start.get("device"),
    )
    return output


def test_the_run_reaches_the_signalled_step(runs: dict, smoke: SmokePart) -> None:
    results = smoke.results
    assert results["signalled_at_step"] is not None, f"exit status {results['exit_status']}: {runs['output']}"


def test_sigterm_saves_last_ckpt_and_exits_143(runs: dict, smoke: SmokePart) -> None:
    results = smoke.results
    ended = (
        results["exit_status"],
        results["exception"],
        results["sigterm_message"],
        runs["last"] is not None,
    )
    expected = (143, "SIGTERMException", True, True)
    assert ended == expected, (
        f"(exit status, exception, 'SIGTERM: saved', last.ckpt): {ended}: {runs['output']}"
    )


def test_the_signalled_step_ran_on_the_device(runs: dict, smoke: SmokePart) -> None:
    assert str(smoke.results["signalled_device"]).startswith(smoke.device), smoke.results["signalled_device"]


def test_the_checkpoint_is_at_the_signalled_step(runs: dict, smoke: SmokePart) -> None:
    step, saved = smoke.results["signalled_at_step"], smoke.results["saved_step"]
    assert saved is not None and step <= saved <= step + 1, f"signalled at step {step}, saved at step {saved}"


def test_ckpt_path_last_resumes_from_the_saved_step(runs: dict, smoke: SmokePart) -> None:
    results = smoke.results
    code, output = results.get("resume_exit_status"), runs.get("resumed_output", "")
    assert code == 0, f"the resumed run exited with {code}: {output[-1500:]}"
    assert "--ckpt_path last: resuming from" in output, "--ckpt_path last did not find the checkpoint"
    steps = (results["checkpoint_step"], results["resumed_from_step"])
    assert steps == (results["saved_step"],) * 2, (
        f"(last.ckpt's step, resumed at) {steps}, saved {results['saved_step']}"
    )


def test_the_resumed_run_trains_to_the_end(runs: dict, smoke: SmokePart) -> None:
    results = smoke.results
    ended = (results.get("final_step"), results.get("resumed_batches"))
    expected = (results["total_steps"], results["total_steps"] - results["saved_step"])
    assert ended == expected, f"the resumed run ended at (step, batches) {ended}, expected {expected}"


def test_it_records_the_results_and_logs(runs: dict, smoke: SmokePart) -> None:
    """The results the docs read, and each command's log."""
    assert not smoke.missing_records("first", "resume"), smoke.missing_records("first", "resume")
