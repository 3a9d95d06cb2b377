"""Installed anywhere, it runs: the wheel built from the repository, installed into a fresh
environment outside the clone, runs ``mae --help``, a few steps of the default pretraining job from an
empty folder with its recipe found by name, and a fine-tune from that run's checkpoint."""

import csv
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO


def _run(command: list, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MAE_DEBUG")}
    result = subprocess.run(
        [str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _copy_sources(target: Path) -> Path:
    """The repository's files (tracked and new, not ignored) copied to ``target``: the wheel is built
    there, so building writes nothing into the clone."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = REPO / name
        if not (source.exists() or source.is_symlink()):
            continue  # deleted in the working tree
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            (target / name).symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, target / name)
    return target


def _see_this_interpreters_packages(python: Path) -> None:
    """Make the packages of the interpreter running the tests importable by ``python`` (a new virtual
    environment's, made without them), as ``--system-site-packages`` would for a system Python: a ``.pth``
    file in its site-packages adds this interpreter's site directories (its own site-packages and those it
    sees: a virtual environment's and, with ``--system-site-packages``, its base's, a conda environment's,
    the system's; the user's where it reads them) with their own ``.pth`` files. ``--system-site-packages``
    alone gives the BASE interpreter's, which lacks the dependencies when the tests run in a virtual
    environment. Added after the environment's own site-packages, so the wheel installed there shadows an
    installation of the clone here (editable or not)."""
    folders = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    target = Path(_run([python, "-c", code], python.parent).stdout.strip())
    lines = [f"import site; site.addsitedir({folder!r})\n" for folder in folders if os.path.isdir(folder)]
    (target / "_tests_interpreter_packages.pth").write_text("".join(lines))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wheel__outside_the_clone_helps_pretrains_by_recipe_name_and_finetunes(tmp_path):
    sources = _copy_sources(tmp_path / "sources")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            ".",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            tmp_path / "dist",
        ],
        sources,
    )
    (wheel,) = (tmp_path / "dist").glob("mae_lightning-*.whl")
    # the dependencies come from this interpreter's site-packages, the project from the wheel
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    python, mae = venv / "bin" / "python", venv / "bin" / "mae"
    _see_this_interpreters_packages(python)
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel], tmp_path)
    work = tmp_path / "empty"
    work.mkdir()
    where = _run([python, "-c", "import mae; print(mae.__file__)"], work).stdout.strip()
    assert Path(where).is_relative_to(venv), f"mae imported from {where}, not from the wheel"

    listing = _run([mae, "--help"], work).stdout
    assert "pretrain" in listing and "finetune" in listing and "recipes" in listing
    assert "imagenet_vit_base_1gpu" in _run([mae, "recipes"], work).stdout

    # 3 epochs of 3 steps: longer than the recipes' 2 warm-up epochs, as the run length check asks
    short = [
        "--trainer.max_epochs",
        "3",
        "--trainer.limit_train_batches",
        "3",
        "--trainer.limit_val_batches",
        "1",
    ]
    pretrain = _run([mae, "pretrain", "--config", "default", *short], work)
    run = work / "runs" / "pretrain_default" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file(), pretrain.stdout[-2000:]
    with open(run / "metrics.csv") as f:
        losses = [float(r["train/loss_epoch"]) for r in csv.DictReader(f) if r.get("train/loss_epoch")]
    assert len(losses) == 3 and all(0 < loss < 10 for loss in losses)

    # its recipe names that checkpoint
    finetune = _run([mae, "finetune", "--config", "default", *short], work)
    assert (work / "runs" / "finetune_default" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    assert "runs/pretrain_default/version_0/checkpoints/last.ckpt" in (finetune.stdout + finetune.stderr)
    assert sorted(p.name for p in work.iterdir()) == ["runs"]
