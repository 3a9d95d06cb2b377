"""A pytest plugin that writes the GPU smoke check's results as JSON (``-p tests.gpu.results --json-out DIR``;
``benchmarks/gpu_smoke.sh`` loads it).

Per part, rewritten after each test: ``<part>.json`` (``status`` ok / failed / timeout / skipped, or running
while its tests run; ``seconds``, ``limit_s``, ``dry_run``, ``device``, ``results`` (what the part measured,
with ``checks_failed``: its failed tests), ``notes``, ``error``, ``log``, ``tests``) and ``<part>.log`` (each
test's outcome, captured output and failure). ``summary.json``: every part's status and seconds, the counts,
``all_ok``. A run whose parts are not all ok exits with status 1, even when every test was skipped.
"""

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.gpu.callbacks import write_json
from tests.gpu.parts import PARTS, part_of, time_limits
from tests.gpu.smoke import STARTED_PARTS

STATUSES = ("ok", "failed", "timeout", "skipped")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpu smoke check")
    group.addoption("--json-out", type=Path, default=None, help="write each part's results here as JSON")
    group.addoption(
        "--smoke-deadline",
        type=float,
        default=None,
        help="time.time() by which the parts must end: a part that no longer fits is skipped",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("json_out") is not None:
        config.pluginmanager.register(ResultsWriter(config), "gpu-smoke-results")


@dataclass
class PartOutcome:
    """What the reports of one part's tests said so far."""

    part: str
    tests: int  # collected
    outcomes: dict[str, str] = field(default_factory=dict)  # test name: passed / failed / skipped
    errors: dict[str, str | None] = field(default_factory=dict)  # message: the first test that gave it
    seconds: float = 0.0
    timed_out: bool = False

    def status(self) -> str:
        if self.timed_out:
            return "timeout"
        if "failed" in self.outcomes.values():
            return "failed"
        if len(self.outcomes) < self.tests:
            return "running"
        return "skipped" if set(self.outcomes.values()) == {"skipped"} else "ok"


class ResultsWriter:
    """Collects each test's report by part and writes the JSON files (see the module's docstring)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.out: Path = config.getoption("json_out").resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.started = time.time()
        self.parts: dict[str, PartOutcome] = {}
        self.dry_run = False

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        counts: dict[str, int] = {}
        for item in session.items:
            part = part_of(item.path)
            if part is not None:
                counts[part] = counts.get(part, 0) + 1
                self.dry_run = self.dry_run or _mode(item) == "cpu"
        self.parts = {part: PartOutcome(part, counts[part]) for part in PARTS if part in counts}
        for part in self.parts:
            (self.out / f"{part}.json").unlink(missing_ok=True)
            (self.out / f"{part}.log").write_text(
                f"== {part} ({'dry run, ' if self.dry_run else ''}device {self.device})\n"
            )
        self.write_summary()

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = self.parts.get(part_of(Path(report.fspath)))
        if outcome is None:
            return
        name = report.nodeid.split("::")[-1]
        outcome.seconds += report.duration
        if (report.when == "call" or not report.passed) and outcome.outcomes.get(name) != "failed":
            outcome.outcomes[name] = report.outcome  # a failed setup or teardown fails the test
        if report.failed:
            self._record_failure(outcome, name, report)
        elif report.skipped:
            outcome.errors.setdefault(_skip_reason(report), None)
        self._append_log(outcome.part, name, report)
        if report.when == "teardown":
            self.write_summary()

    def _record_failure(self, outcome: PartOutcome, name: str, report: pytest.TestReport) -> None:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
        if message.startswith("Failed: Timeout"):
            outcome.timed_out = True
            limit, _ = time_limits(outcome.part, self.dry_run)
            message = f"exceeded its time limit of {limit:.0f} s"
        outcome.errors.setdefault(message[:1500], name)  # a module fixture's failure repeats in each test

    def _append_log(self, part: str, name: str, report: pytest.TestReport) -> None:
        lines = [f"-- {name} {report.when}: {report.outcome} ({report.duration:.1f} s)"]
        lines += [f"---- {title}\n{text}" for title, text in report.sections]
        if report.failed:
            lines.append(report.longreprtext)
        with open(self.out / f"{part}.log", "a") as log:
            log.write("\n".join(lines) + "\n")

    def part_record(self, outcome: PartOutcome) -> dict:
        """``<part>.json``'s content."""
        smoke = self.config.stash.get(STARTED_PARTS, {}).get(outcome.part)
        results = dict(smoke.results) if smoke is not None else {}
        results["checks_failed"] = [name for name, result in outcome.outcomes.items() if result == "failed"]
        status = outcome.status()
        record = {
            "part": outcome.part,
            "status": status,
            "seconds": round(outcome.seconds, 2),
            "limit_s": time_limits(outcome.part, self.dry_run)[0],
            "dry_run": self.dry_run,
            "device": self.device,
            "results": results,
            "notes": smoke.notes if smoke is not None else [],
            "error": _error(outcome.errors) if status != "ok" else None,
            "log": f"{outcome.part}.log",
            "tests": outcome.outcomes,
        }
        return record

    def write_summary(self) -> dict:
        """Every started part's ``<part>.json``, then ``summary.json``."""
        deadline = self.config.getoption("smoke_deadline")
        parts = []
        for outcome in self.parts.values():
            if outcome.outcomes:
                record = self.part_record(outcome)
                write_json(self.out / f"{outcome.part}.json", record)
                parts.append({key: record[key] for key in ("part", "status", "seconds", "limit_s", "error")})
        counts = {status: sum(p["status"] == status for p in parts) for status in STATUSES}
        summary = {
            "dry_run": self.dry_run,
            "device": self.device,
            "parts_requested": list(self.parts),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.started)),
            "deadline": deadline,
            "budget_s": round(deadline - self.started, 1) if deadline else None,
            "parts": parts,
            "seconds": round(time.time() - self.started, 2),
            "counts": counts,
            "all_ok": bool(self.parts) and counts["ok"] == len(self.parts),
        }
        write_json(self.out / "summary.json", summary)
        return summary

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.write_summary()["all_ok"] and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _mode(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("smoke") if callspec is not None else None


def _error(errors: dict[str, str | None]) -> str:
    """Each distinct message once, after the first test that gave it (a skip's reason alone)."""
    return "; ".join(message if name is None else f"{name}: {message}" for message, name in errors.items())


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")
