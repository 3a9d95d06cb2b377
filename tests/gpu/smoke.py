"""What a part of the GPU smoke check works with (``SmokePart``, the ``smoke`` fixture) and what it records.

A part runs on the GPU (CUDA, bf16, the real sizes) or, in the dry run, on the CPU with tiny sizes and
fp32: the same code and checks, so a broken part fails on the CPU too. ``mae`` commands run as forked
children of an interpreter that has imported the project (``tests.forked_commands``); their output goes to
``<part>.<run>.log``. ``results`` and ``notes`` end up in ``<part>.json`` (``tests/gpu/results.py``).
"""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.forked_commands import ForkedProcess
from tests.gpu.parts import RESULT_KEYS
from tests.helpers import REPO, TINY_KWARGS

# The parts of this session that have started, by name (read by the results plugin).
STARTED_PARTS = pytest.StashKey[dict]()
CSV_LOGGER = "lightning.pytorch.loggers.CSVLogger"


@dataclass
class SmokePart:
    """One part of the smoke check in one mode: where it works, where its logs go, what it measured."""

    part: str
    dry_run: bool
    work: Path  # scratch folder of the part
    logs: Path  # where <part>.<run>.log files go
    results: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    @property
    def accelerator(self) -> str:
        return "cpu" if self.dry_run else "gpu"

    @property
    def precision(self) -> str:
        return "32-true" if self.dry_run else "bf16-mixed"

    def note(self, text: str) -> None:
        """A remark for ``<part>.json``, such as what the dry run does differently."""
        print(f"note: {text}", flush=True)
        self.notes.append(text)

    def log(self, name: str) -> Path:
        return self.logs / f"{self.part}.{name}.log"

    @contextlib.contextmanager
    def start_mae(self, name: str, *args: str) -> Iterator[ForkedProcess]:
        """``mae *args`` started; its output is written to ``<part>.<name>.log`` and a child still running
        is killed when the block ends (also when the part's time limit interrupts it)."""
        log = self.log(name)
        print(f"$ mae {' '.join(args)}   (output: {log.name})", flush=True)
        child = ForkedProcess(["-m", "mae", *args], REPO)
        try:
            yield child
        finally:
            log.write_text(child.stdout() + child.stderr())
            child.close()

    def run_mae(self, name: str, *args: str) -> tuple[int, str]:
        """``mae *args`` run to its end: (exit status, its output)."""
        with self.start_mae(name, *args) as child:
            code = child.wait()
        print(f"  exit status {code}", flush=True)
        return code, self.log(name).read_text(errors="replace")

    def missing_records(self, *runs: str) -> list[str]:
        """The keys of ``RESULT_KEYS`` missing from the results, and the empty or missing logs of ``runs``."""
        missing = sorted(RESULT_KEYS[self.part] - set(self.results))
        return missing + [
            self.log(run).name
            for run in runs
            if not (self.log(run).exists() and self.log(run).stat().st_size)
        ]

    def write_config(self, name: str, config: dict) -> Path:
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def default_job_model(self) -> dict:
        """The default job's ``model`` section (in the dry run its tiny version) without the lr warm-up,
        which must be shorter than these short runs."""
        if self.dry_run:
            return {
                "model": "mae_vit_tiny_patch4",
                "model_kwargs": dict(TINY_KWARGS),
                "optim": {"warmup_epochs": 0},
            }
        model = yaml.safe_load((REPO / "mae" / "configs" / "pretrain" / "default.yaml").read_text())["model"]
        return {**model, "optim": {**model.get("optim", {}), "warmup_epochs": 0}}

    def digits(self, img_size: int, batch_size: int) -> dict:
        """The built-in digits data module, loading in the training process."""
        init = {"img_size": img_size, "batch_size": batch_size, "num_workers": 0}
        return {"class_path": "mae.data.DigitsDataModule", "init_args": init}

    def pretrain_config(
        self, name: str, model: dict, data: dict, callbacks: list[dict], **trainer: Any
    ) -> dict:
        """A ``mae pretrain`` config: no validation, figures or kNN; CSV metrics in the work folder."""
        logger = {"class_path": CSV_LOGGER, "init_args": {"save_dir": str(self.work / "runs"), "name": name}}
        trainer_settings = {
            "accelerator": self.accelerator,
            "devices": 1,
            "precision": self.precision,
            "enable_progress_bar": False,
            "log_every_n_steps": 5,
            "limit_val_batches": 0,
            "num_sanity_val_steps": 0,
            "logger": logger,
            "callbacks": callbacks,
            **trainer,
        }
        return {
            "seed_everything": 0,
            "model": model,
            "data": data,
            "trainer": trainer_settings,
            "reconstruction": {"every_n_epochs": 0},
            "knn": {"every_n_epochs": 0},
        }


def callback(cls: type, **init_args: Any) -> dict:
    """A config's entry for one of ``tests.gpu.callbacks``' callbacks."""
    return {"class_path": f"{cls.__module__}.{cls.__name__}", "init_args": init_args}
