"""The training commands' configuration surface, through the ``mae`` command: a ``--config`` file that cannot
be used (empty, not YAML, not a mapping, a folder, not text; also as the base a stacked config names), and a
trainer setting Lightning refuses, each end in one ``error:`` line naming the file or key, exit status 2,
before any work; a bug in the project's own code raised at the same moment keeps its traceback. A stacked
recipe printed by ``mae recipes --show`` runs on its own as the recipe does."""

import textwrap

import pytest
import yaml

from tests.forked_commands import run_forked
from tests.helpers import REPO, run_mae

# Files that cannot be a config: (name, bytes, what the error line says of it).
UNUSABLE = {
    "empty": (b"", "empty: it sets nothing"),
    "comments-only": (b"# nothing here yet\n", "empty: it sets nothing"),
    "yaml-syntax": (b"model:\n  mask_ratio: [0.5\ntrainer:\n  max_epochs: 1\n", "not valid YAML: line 3"),
    "list": (b"- model\n- trainer\n", "a YAML list, not a mapping of settings"),
    "scalar": (b"max_epochs\n", "a YAML single value, not a mapping of settings"),
    "not-text": (bytes(range(128, 256)), "not a text file (UTF-8)"),
}


def _error_line(result) -> str:
    """The last line of stderr, after checking the run ended as a user's mistake does."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("case", UNUSABLE, ids=UNUSABLE.keys())
def test_unusable_config_file__one_error_line_naming_the_file(case, tmp_path):
    content, said = UNUSABLE[case]
    path = tmp_path / "settings.yaml"
    path.write_bytes(content)
    line = _error_line(run_mae("pretrain", "--config", "default", "--config", str(path), check=False))
    assert line.startswith(f"error: --config {path}: ") and said in line, line


def test_a_folder_given_as_config__one_error_line(tmp_path):
    line = _error_line(run_mae("pretrain", f"--config={tmp_path}", check=False))
    assert line.startswith(f"error: --config {tmp_path}: a folder, not a YAML file"), line


@pytest.mark.parametrize("command", ["finetune", "detect", "segment"])
def test_unusable_config_file__the_other_training_commands_too(command, tmp_path):
    path = tmp_path / "settings.yaml"
    path.write_bytes(UNUSABLE["yaml-syntax"][0])
    line = _error_line(run_mae(command, "-c", str(path), check=False))
    assert line.startswith(f"error: --config {path}: not valid YAML: line 3, column"), line


BASES = {
    "empty": ("# stacks on: base.yaml\n", b"", "empty: it sets nothing"),
    "missing": ("# stacks on: missing.yaml\n", None, "no such file"),
    "loop": ("# stacks on: base.yaml\n", b"# stacks on: top.yaml\nseed_everything: 1\n", "stack in a loop"),
}


@pytest.mark.parametrize("case", BASES, ids=BASES.keys())
def test_a_stacked_config_whose_base_cannot_be_used__names_both(case, tmp_path):
    first_line, base, said = BASES[case]
    top = tmp_path / "top.yaml"
    top.write_text(first_line + "trainer:\n  max_epochs: 1\n")
    if base is not None:
        (tmp_path / "base.yaml").write_bytes(base)
    line = _error_line(run_mae("pretrain", "--config", str(top), check=False))
    assert line.startswith("error: ") and str(top) in line and said in line, line


def _quiet_logger(tmp_path) -> list[str]:
    return [f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}", "--trainer.enable_progress_bar=false"]


REFUSED = {
    "max_epochs": (["--trainer.max_epochs=-5"], "trainer.max_epochs: ", "must be a non-negative integer"),
    "accelerator": (["--trainer.accelerator=nope"], "trainer.accelerator: ", "invalid accelerator name"),
    "num_nodes": (["--trainer.num_nodes=0"], "trainer.num_nodes: ", "must be a positive integer"),
    "save_top_k": (["--checkpoint.save_top_k=-5"], "checkpoint.save_top_k: ", "Must be >= -1"),
}


@pytest.mark.parametrize("case", REFUSED, ids=REFUSED.keys())
def test_a_trainer_setting_lightning_refuses__one_error_line_naming_the_key(case, tmp_path):
    args, key, reason = REFUSED[case]
    result = run_mae("pretrain", "--config", "default", *_quiet_logger(tmp_path), *args, check=False)
    line = _error_line(result)
    assert line.startswith(f"error: {key}") and reason in line and "Lightning" in line, line
    assert not (tmp_path / "runs").exists()


def test_a_lightning_error_raised_in_our_own_code_keeps_its_traceback(tmp_path):
    """A ``MisconfigurationException`` from the project's module (a bug, planted) is not a setting."""
    script = tmp_path / "console.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            from lightning.fabric.utilities.exceptions import MisconfigurationException
            import mae.training.pretrain as pretrain
            from mae.cli.main import console_main

            def planted(*args, **kwargs):
                raise MisconfigurationException("planted bug in the module")

            pretrain.create_model = planted
            sys.argv = ["mae", *sys.argv[1:]]
            console_main()
            """
        )
    )
    result = run_forked([str(script), "pretrain", "--config", "default", *_quiet_logger(tmp_path)], REPO, 300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback (most recent call last)" in result.stderr and "error:" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.endswith("MisconfigurationException: planted bug in the module")


def _printed_config(*args: str) -> dict:
    """The config ``mae pretrain *args --print_config`` resolves, without the config files' paths."""
    config = yaml.safe_load(run_mae("pretrain", *args, "--print_config").stdout)
    config.pop("config", None)
    return config


def test_a_stacked_recipe_shown_runs_on_its_own_as_the_recipe(tmp_path):
    shown = run_mae("recipes", "--show", "default_progressive").stdout
    assert "pretrain/default" in shown.splitlines()[1]  # the header names what it was made from
    path = tmp_path / "p.yaml"
    path.write_text(shown)
    saved = _printed_config("--config", str(path))
    recipe = _printed_config("--config", "default_progressive")
    assert saved == recipe
    assert saved["data"]["class_path"] == "mae.data.DigitsDataModule"  # from the base recipe
    assert saved["model"]["resolution_schedule"] == [[0, 16], [0.8, 32]]  # from the stacked one


# A class path of 0.1's recipes, whose module 0.2.0 moved (0.3.0 removed the old path): (command, how it is
# given, the old class path, its path now).
MOVED_CLASSES = {
    "pretrain-config": (
        "pretrain",
        "config",
        "mae.dense.scene_images.DigitSceneImagesDataModule",
        "mae.data.DigitSceneImagesDataModule",
    ),
    "finetune-option": (
        "finetune",
        "option",
        "mae.dense.scene_images.DigitSceneImagesDataModule",
        "mae.data.DigitSceneImagesDataModule",
    ),
    "detect-config": (
        "detect",
        "config",
        "mae.dense.detection_data.DigitScenesDataModule",
        "mae.dense.DigitScenesDataModule",
    ),
}


@pytest.mark.parametrize("case", MOVED_CLASSES, ids=MOVED_CLASSES.keys())
def test_a_class_path_of_a_moved_module__one_error_line_naming_the_new_path(case, tmp_path):
    """A 0.2 user's config (or ``--data`` option) gets the class's new path, not jsonargparse's wall of union
    subtypes and import errors; nothing is run or written."""
    command, given, old, new = MOVED_CLASSES[case]
    logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp_path)}}
    config = {"trainer": {"max_epochs": 1, "logger": logger}}
    if given == "config":
        config["data"] = {"class_path": old, "init_args": {"img_size": 16}}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(config))
    option = ("--data", old) if given == "option" else ()
    line = _error_line(run_mae(command, "--config", str(path), *option, check=False))
    where = f"--config {path}: data.class_path" if given == "config" else "--data:"
    assert line == f"error: {where} {old} was moved to {new} in 0.2.0: set {new} instead", line
    assert [p.name for p in tmp_path.iterdir()] == ["old.yaml"]
