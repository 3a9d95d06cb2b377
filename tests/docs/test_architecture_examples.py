"""The architecture page's worked examples ("Add a masking strategy", "Add a data source"), followed step by
step: each ``<!-- step: ... -->`` edit is applied, in the page's order, to a copy of the package, then the
result is used as the page says (a model masks with the new strategy; ``mae pretrain`` trains on the new
data module) in a separate process that imports the copy. A step whose anchor is no longer in the code
fails here, naming it, so the page cannot drift from the code."""

import json
import re
import shutil
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from mae.apps.anomaly.digits import write_digit_anomalies
from tests.forked_commands import run_forked
from tests.helpers import REPO, tiny_pretraining_checkpoint, write_image_folder

PAGE = REPO / "docs" / "architecture.md"
STEP = re.compile(
    r"<!-- step: (?P<action>[\w-]+) (?P<file>\S+)(?: \| (?P<anchor>.+?))? -->\n```python\n(?P<code>.*?)```",
    re.S,
)


@dataclass(frozen=True)
class Step:
    action: str  # replace-line, insert-before, insert-after or new-file
    file: str  # relative to the repository
    anchor: str | None  # the line (its start) the edit is placed at
    code: str


def example_steps(title: str) -> list[Step]:
    """The steps of the example under the heading ``### <title>``, in the page's order."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split(f"### {title}\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return [Step(m["action"], m["file"], m["anchor"], m["code"]) for m in STEP.finditer(section)]


def apply(step: Step, root: Path) -> None:
    """Make the edit in the copy under ``root``.

    Raises:
        AssertionError: the anchor line is not (or not once) in the file, naming the step.
    """
    path = root / step.file
    if step.action == "new-file":
        assert not path.exists(), f"{step.file} exists already: the example would replace it"
        path.parent.mkdir(parents=True, exist_ok=True)  # a test's folder, beside the package's copy
        path.write_text(step.code, encoding="utf-8")
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if line.strip().startswith(step.anchor)]
    assert len(found) == 1, (
        f"step {step.action} {step.file} | {step.anchor}: the anchor is in {len(found)} lines"
    )
    at = found[0]
    if step.action == "replace-line":
        lines[at : at + 1] = [step.code]
    elif step.action == "insert-before":
        lines[at:at] = [step.code]
    elif step.action == "insert-after":
        lines[at + 1 : at + 1] = [step.code]
    else:
        raise AssertionError(f"unknown step action {step.action!r}")
    path.write_text("".join(lines), encoding="utf-8")


def package_copy(tmp_path: Path, title: str) -> Path:
    """A copy of the ``mae`` package with the example's steps applied; its folder goes first on the path."""
    root = tmp_path / "clone"
    shutil.copytree(REPO / "mae", root / "mae", ignore=shutil.ignore_patterns("__pycache__"))
    steps = example_steps(title)
    assert steps, f"no steps under '### {title}' in {PAGE}"
    for step in steps:
        apply(step, root)
    return root


# ``python -c CODE ARGS`` with ``PYTHONPATH=ROOT``, run as ``python LAUNCHER ROOT CODE ARGS`` in a forked
# child of the suite's preloaded interpreter (``tests.forked_commands``): torch, Lightning and timm stay
# imported (the copy imports them unchanged), every ``mae`` module is dropped and imported anew from the
# copy, checked.
LAUNCHER = """\
import sys

root, code = sys.argv[1], sys.argv[2]
sys.argv = ["-c", *sys.argv[3:]]
sys.path[0:1] = ["", root]  # python -c: the working folder first; then PYTHONPATH
for name in [n for n in sys.modules if n == "mae" or n.startswith("mae.")]:
    del sys.modules[name]
import mae

assert mae.__file__.startswith(root + "/"), f"mae imported from {mae.__file__}, not from the copy {root}"
del mae
exec(compile(code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""


def run_python(root: Path, code: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``python -c code *args`` in a process of its own that imports ``mae`` from the copy at ``root`` (its
    working folder, on its ``PYTHONPATH``; ``HOME`` there too): a forked child of the suite's preloaded
    interpreter with every ``mae`` module imported anew from the copy (``LAUNCHER``). With ``check``, a
    non-zero exit fails the test, showing the output's tail."""
    launcher = root.parent / "launch_copy.py"
    launcher.write_text(LAUNCHER)
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "HOME": str(root)}
    result = run_forked([str(launcher), str(root), textwrap.dedent(code), *args], root, timeout=280, env=env)
    assert not check or result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


def package_copy_whose_new_test_passes(tmp_path: Path, title: str, test: str) -> Path:
    """``package_copy`` with the example's one new test (``test``, a step's new file) run in it, passing."""
    root = package_copy(tmp_path, title)
    tested = run_python(
        root, "import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', sys.argv[1]]))", test
    )
    assert "1 passed" in tested.stdout
    return root


PRETRAIN_FOR_TWO_STEPS = [
    "--trainer.max_steps",
    "2",
    "--trainer.limit_val_batches",
    "0",
    "--trainer.enable_progress_bar",
    "false",
    "--model.optim.warmup_epochs",
    "0",
    "--knn.every_n_epochs",
    "0",
    "--data.batch_size",
    "4",
]
MAE_COMMAND = "import sys; from mae.cli.main import main; main(sys.argv[1:])"


@pytest.mark.slow
def test_example__add_a_masking_strategy(tmp_path):
    root = package_copy(tmp_path, "Add a masking strategy")
    checked = run_python(
        root,
        """
        import sys
        import mae, torch
        from mae.models import create_model
        from mae.models.masking import MASK_STRATEGIES, random_masking, sample_noise

        assert mae.__file__.startswith(sys.argv[1]) and "centre" in MASK_STRATEGIES
        model = create_model(
            "mae_vit_tiny_patch4", img_size=32, mask_strategy="centre", depth=1, decoder_depth=1
        )
        loss, pred, mask = model(torch.rand(2, 3, 32, 32), mask_ratio=0.75)
        assert torch.isfinite(loss) and mask.sum(1).tolist() == [48.0, 48.0]
        torch.manual_seed(0)
        noise = sample_noise("centre", 400, (8, 8), 0.75)
        _, masks, _ = random_masking(torch.zeros(400, 64, 1), 0.75, noise)
        grid = masks.mean(0).reshape(8, 8)
        assert grid[3:5, 3:5].mean() < 0.5 < grid[[0, 0, 7, 7], [0, 7, 0, 7]].mean(), grid
        print("masked share, centre vs corners:", grid[3:5, 3:5].mean().item(), grid[0, 0].item())
        """,
        str(root),
    )
    assert "masked share" in checked.stdout
    trained = run_python(
        root,
        MAE_COMMAND,
        "pretrain",
        "--config",
        "default",
        "--model.mask_strategy",
        "centre",
        *PRETRAIN_FOR_TWO_STEPS,
    )
    assert "Run folder:" in trained.stdout


@pytest.mark.slow
def test_example__add_a_data_source(tmp_path):
    root = package_copy(tmp_path, "Add a data source")
    data = tmp_path / "clone" / "images"
    write_image_folder(data / "pictures", ["cat", "dog", "fox"], per_class=4, size=(40, 30))
    images = sorted((data / "pictures").rglob("*.jpg"))
    (data / "train.csv").write_text(
        "".join(f"pictures/{p.parent.name}/{p.name},{p.parent.name}\n" for p in images)
    )
    (data / "val.csv").write_text(
        "".join(f"pictures/{p.parent.name}/{p.name},{p.parent.name}\n" for p in images[::3])
    )
    listed = [
        "--data",
        "mae.data.ImageListDataModule",
        "--data.train_list",
        str(data / "train.csv"),
        "--data.val_list",
        str(data / "val.csv"),
        "--data.img_size",
        "32",
    ]
    trained = run_python(
        root, MAE_COMMAND, "pretrain", "--config", "default", *listed, *PRETRAIN_FOR_TWO_STEPS
    )
    assert (
        "ImageListDataModule: 12 training images in 3 classes, 4 validation images"
        in trained.stderr + trained.stdout
    )
    refused = run_python(
        root,
        MAE_COMMAND,
        "pretrain",
        "--config",
        "default",
        *listed[:2],
        "--data.train_list",
        str(data / "missing.csv"),
        *listed[4:],
        *PRETRAIN_FOR_TWO_STEPS,
        check=False,
    )
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert (
        refused.stderr.strip().splitlines()[-1] == f"error: data list {data / 'missing.csv'} does not exist"
    )


@pytest.mark.slow
def test_example__add_an_anomaly_scorer(tmp_path):
    root = package_copy_whose_new_test_passes(
        tmp_path, "Add an anomaly scorer", "tests/unit/apps/anomaly/scorers/test_mean_feature.py"
    )
    checkpoint = tiny_pretraining_checkpoint(tmp_path / "mae")
    digits = write_digit_anomalies(tmp_path / "digits", seed=0, num_normal=8, num_test=8)
    test = ["--test", str(digits / "test"), "--figures", "none"]
    fit = [
        "--method",
        "mean-feature",
        "--checkpoint",
        str(checkpoint),
        "--normal",
        str(digits / "train" / "good"),
    ]
    fitted = run_python(
        root,
        MAE_COMMAND,
        "anomaly",
        *fit,
        *test,
        "--out",
        str(tmp_path / "fit"),
        "--save-scorer",
        str(tmp_path / "sc"),
    )
    assert "normal images: 6 " in fitted.stdout and "the mean of their patch tokens" in fitted.stdout
    metrics = json.loads((tmp_path / "fit" / "metrics.json").read_text())
    assert metrics["settings"]["method"] == "mean-feature" and 0 <= metrics["image_auroc"] <= 1
    assert set(json.loads((tmp_path / "sc" / "scorer.json").read_text())["settings"]) == {"seed", "top_k"}
    run_python(
        root,
        MAE_COMMAND,
        "anomaly",
        "--scorer",
        str(tmp_path / "sc"),
        *test,
        "--out",
        str(tmp_path / "again"),
    )
    assert (tmp_path / "again" / "scores.csv").read_bytes() == (tmp_path / "fit" / "scores.csv").read_bytes()


@pytest.mark.slow
def test_example__add_a_checkpoint_format(tmp_path):
    root = package_copy_whose_new_test_passes(
        tmp_path, "Add a checkpoint format", "tests/unit/convert/formats/test_bundle.py"
    )
    run_python(
        root,
        """
        import torch
        from mae.models import MaskedAutoencoderViT

        config = dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=4)
        model = MaskedAutoencoderViT(**config, decoder_embed_dim=16, decoder_depth=1, decoder_num_heads=2)
        encoder = {k: v for k, v in model.state_dict().items() if not k.startswith(("decoder", "mask_token"))}
        torch.save({"encoder": encoder, "config": config}, "bundle.pt")
        """,
    )
    exported = run_python(
        root,
        MAE_COMMAND,
        "export",
        "--checkpoint",
        "bundle.pt",
        "--checkpoint-format",
        "bundle",
        "--out",
        "e.safetensors",
    )
    assert "wrote e.safetensors and e.json" in exported.stdout and "note:" not in exported.stdout
    assert json.loads((root / "e.json").read_text())["model_args"]["num_heads"] == 4


def test_steps__each_example_has_its_steps_and_a_moved_anchor_is_named(tmp_path):
    """Fast: the page's steps parse, and a step whose anchor left the code fails naming it."""
    assert [s.action for s in example_steps("Add a masking strategy")] == [
        "replace-line",
        "insert-before",
        "insert-after",
    ]
    assert [s.action for s in example_steps("Add a data source")] == [
        "new-file",
        "insert-after",
        "insert-after",
    ]
    assert [s.action for s in example_steps("Add an anomaly scorer")] == [
        "new-file",
        "insert-after",
        "insert-after",
        "new-file",
    ]
    assert [s.action for s in example_steps("Add a checkpoint format")] == [
        "new-file",
        "insert-after",
        "insert-after",
        "new-file",
    ]
    (tmp_path / "m.py").write_text("x = 1\n")
    with pytest.raises(AssertionError, match=r"insert-after m.py \| y = : the anchor is in 0 lines"):
        apply(Step("insert-after", "m.py", "y = ", "z = 2\n"), tmp_path)
