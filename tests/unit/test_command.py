"""A user's mistake ends every command with the project's message alone as the last line and exit
status 2; ``--debug`` keeps the traceback; a bug keeps its traceback."""

import ast
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from mae.cli.command import USAGE_ERROR_EXIT_CODE, run_command
from mae.cli.main import invoke
from tests.helpers import REPO, run_mae

ROOT_ENTRY_POINTS = {"train.py": "pretrain", "finetune.py": "finetune"}


def _four_band_folder(root: Path) -> Path:
    for i in range(3):
        (root / "train" / "a").mkdir(parents=True, exist_ok=True)
        tifffile.imwrite(root / "train" / "a" / f"{i}.tif", np.zeros((16, 16, 4), np.uint8))
    return root


def _only_the_message(stderr: str, expected: str) -> None:
    assert "Traceback" not in stderr and "Union subtypes" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and expected in last, stderr[-3000:]


def test_train__data_module_error_inside_jsonargparse_is_printed_alone(tmp_path):
    """The error the issue quotes: raised while jsonargparse builds the data module."""
    args = [
        "--config",
        "configs/pretrain/default.yaml",
        "--data.class_path",
        "mae.data.ImageFolderDataModule",
        "--data.root",
        str(_four_band_folder(tmp_path / "data")),
        "--data.in_chans",
        "4",
    ]
    result = run_mae("pretrain", *args, check=False)
    assert result.returncode == USAGE_ERROR_EXIT_CODE
    _only_the_message(result.stderr, "data.mean and data.std are needed for 4-channel data")
    debug = run_mae("pretrain", *args, "--debug", check=False)
    assert debug.returncode != 0 and "Traceback" in debug.stderr  # --debug keeps the whole story


def test_train__error_in_the_data_module_setup_inside_fit(tmp_path):
    result = run_mae(
        "pretrain",
        "--config",
        "configs/pretrain/default.yaml",
        "--data.class_path",
        "mae.data.StreamingDataModule",
        "--data.root",
        str(tmp_path / "nothing"),
        "--trainer.logger",
        "false",
        "--trainer.default_root_dir",
        str(tmp_path),
        check=False,
    )
    assert result.returncode == USAGE_ERROR_EXIT_CODE
    _only_the_message(result.stderr, f"no shard folder at data.root={tmp_path / 'nothing'}")


def test_python_m__a_command_prints_the_message_alone():
    result = run_mae("stats", "/nonexistent/folder", check=False)
    assert result.returncode == USAGE_ERROR_EXIT_CODE
    _only_the_message(result.stderr, "/nonexistent/folder")


@pytest.mark.parametrize(
    "command, argv, expected",
    [
        (
            "finetune",
            [
                "--config",
                "configs/finetune/default.yaml",
                "--model.encoder.checkpoint",
                "/no/pretrained.ckpt",
            ],
            "model.encoder.checkpoint /no/pretrained.ckpt does not exist",
        ),
        (
            "export",
            ["--checkpoint", "/no/file.ckpt", "--out", "/tmp/never.safetensors"],
            "/no/file.ckpt does not exist",
        ),
        (
            "knn",
            ["--checkpoint", "/no/file.ckpt", "--data.class_path", "mae.data.DigitsDataModule"],
            "/no/file.ckpt does not exist",
        ),
        (
            "probe",
            ["--checkpoint", "/no/file.ckpt", "--data.class_path", "mae.data.DigitsDataModule"],
            "/no/file.ckpt does not exist",
        ),
        ("reconstruct", ["--checkpoint", "/no/file.ckpt", "/no/images"], "/no/file.ckpt does not exist"),
        ("demo", ["--checkpoint", "/no/file.ckpt"], "/no/file.ckpt does not exist"),
        (
            "embed",
            ["--checkpoint", "/no/file.ckpt", "/no/images", "--out", "/tmp/never.parquet"],
            "/no/images does not exist",
        ),
        (
            "search",
            ["--index", "/no/index.parquet", "/no/query.png"],
            "index /no/index.parquet does not exist",
        ),
        (
            "anomaly",
            [
                "--checkpoint",
                "/no/file.ckpt",
                "--normal",
                "/no/normal",
                "--test",
                "/no/test",
                "--out",
                "/tmp/never",
            ],
            "test folder /no/test does not exist",
        ),
        ("stats", ["/no/images"], "/no/images"),
        ("shard", ["/no/images", "--out", "/tmp/never-shards"], "/no/images/train does not exist"),
        (
            "pretrain",
            ["--config", "configs/pretrain/default.yaml", "--data.batch_size", "0"],
            "data.batch_size must be >= 1, got 0",
        ),
    ],
)
def test_every_command__project_error_exits_2_with_its_message(command, argv, expected, capsys, monkeypatch):
    monkeypatch.delenv("MAE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        run_command(partial(invoke, command, argv))
    assert exit_info.value.code == USAGE_ERROR_EXIT_CODE
    _only_the_message(capsys.readouterr().err, expected)


def test_outputs__a_refusal_to_write_over_files_is_an_error_line_and_nothing_is_touched(
    tmp_path, capsys, monkeypatch
):
    """An output folder holding files the command did not write (FileExistsError from a project check)."""
    monkeypatch.delenv("MAE_DEBUG", raising=False)
    (tmp_path / "images" / "train" / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "images" / "train" / "a" / "x.png")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("the user's")
    with pytest.raises(SystemExit) as exit_info:
        run_command(partial(invoke, "shard", [str(tmp_path / "images"), "--out", str(tmp_path / "out")]))
    assert exit_info.value.code == USAGE_ERROR_EXIT_CODE
    _only_the_message(
        capsys.readouterr().err, "holds 1 file(s) that no conversion of this tool wrote there (mine.txt)"
    )
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]
    assert (tmp_path / "out" / "mine.txt").read_text() == "the user's"


def test_a_bug_keeps_its_traceback(monkeypatch):
    monkeypatch.delenv("MAE_DEBUG", raising=False)

    def bug():
        return {}["missing"]

    with pytest.raises(KeyError):
        run_command(bug)
    with pytest.raises(ValueError, match="not ours"):  # a library's ValueError is not a project message
        run_command(partial(int, "not ours"))


def test_a_bug_raised_while_handling_a_users_mistake_keeps_its_traceback(monkeypatch):
    """The chain is looked through only for a parser's wrapping error: a bug in an ``except InputError``
    block is a bug, not the mistake it was handling."""
    from mae.errors import InputError

    monkeypatch.delenv("MAE_DEBUG", raising=False)

    def handler_with_a_bug():
        try:
            raise InputError("the user's unreadable file")
        except InputError:
            return {}["missing"]

    with pytest.raises(KeyError):
        run_command(handler_with_a_bug)


@pytest.mark.parametrize("script, command", sorted(ROOT_ENTRY_POINTS.items()))
def test_root_entry_points__are_the_mae_command(script, command):
    """``python train.py`` / ``finetune.py`` run ``mae pretrain`` / ``mae finetune``: the same main, errors
    and exit statuses (``mae.cli.main.main``), nothing of their own."""
    tree = ast.parse((REPO / script).read_text())
    main_block = [
        node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
    ]
    assert main_block and ast.unparse(main_block[0].body[0]) == f"main(['{command}', *sys.argv[1:]])", script
    assert {ast.unparse(node) for node in tree.body if isinstance(node, ast.ImportFrom)} == {
        "from mae.cli.main import main"
    }


def test_user_errors__every_family_is_an_error_line_with_status_2(capsys, monkeypatch):
    from mae import errors

    monkeypatch.delenv("MAE_DEBUG", raising=False)
    families = [errors.ConfigError, errors.InputError, errors.MissingFileError, errors.OutputExistsError]
    for family in families:

        def mistake(family=family):
            raise family(f"a {family.__name__} naming the key and the fix")

        with pytest.raises(SystemExit) as exit_:
            run_command(mistake)
        assert exit_.value.code == USAGE_ERROR_EXIT_CODE
        _only_the_message(capsys.readouterr().err, f"a {family.__name__} naming the key and the fix")
    assert issubclass(errors.ConfigError, ValueError) and issubclass(
        errors.MissingFileError, FileNotFoundError
    )


def test_a_planted_bug__a_value_error_in_a_model_function_keeps_its_traceback(capsys, monkeypatch, tmp_path):
    """A ``ValueError`` raised by the package's own code but not as a user error (a bug) is never shown as
    a one-line message: run through the real command, it ends in its traceback (exit status 1)."""
    import mae.models.mae as model_module

    monkeypatch.delenv("MAE_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)

    def planted(*args, **kwargs):
        raise ValueError("planted bug in the model")

    monkeypatch.setattr(model_module.MaskedAutoencoderViT, "forward_loss", planted)
    one_step = {
        "trainer.max_epochs": 1,
        "trainer.limit_train_batches": 1,
        "trainer.limit_val_batches": 0,
        "trainer.enable_progress_bar": "false",
        "model.optim.warmup_epochs": 0,
    }
    argv = ["pretrain", "--config", "default", *(f"--{key}={value}" for key, value in one_step.items())]
    from mae.cli.main import main

    with pytest.raises(ValueError, match="planted bug in the model"):
        main(argv)
    assert "error: planted bug" not in capsys.readouterr().err


@pytest.mark.parametrize("ends", ["returns", "raises"])
def test_run_command__closes_the_process_group_a_run_left_open(ends, tmp_path, monkeypatch):
    """Lightning leaves DDP's group open; a command closes it whether it ends well or not."""
    import torch.distributed as dist

    monkeypatch.delenv("MAE_DEBUG", raising=False)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)

    def run():
        assert dist.is_initialized()
        if ends == "raises":
            raise ValueError("the run's own failure")

    try:
        run_command(run)
    except ValueError:
        assert ends == "raises"
    assert not dist.is_initialized()
