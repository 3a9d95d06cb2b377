"""What the evaluation commands (mae knn, mae probe) and the pretraining monitors (kNN, linear probe) do with
settings out of range and with long work, through their command lines: a value out of range is refused
by the parser in one line naming the option and the range (not a top-1 of 10 % for ``-k 0`` or a
traceback for ``-k -3``); a k above the memory bank is lowered with a note; feature extraction shows
its progress, and a monitor says first what it extracts and which settings limit or turn it off."""

import pytest

from tests.helpers import TINY_MODEL, run_mae, tiny_pretraining_checkpoint, write_image_folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_pretraining_checkpoint(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The data flags of an ``ImageFolderDataModule`` of 12 training and 6 validation images in 3 classes."""
    root = tmp_path_factory.mktemp("data")
    write_image_folder(root / "train", ["a", "b", "c"], per_class=4, size=(20, 20))
    write_image_folder(root / "val", ["a", "b", "c"], per_class=2, size=(20, 20), seed=1)
    flags = ["--data.class_path", "mae.data.ImageFolderDataModule", "--data.root", str(root)]
    return [*flags, "--data.img_size", "16", "--data.num_workers", "0"]


def last_error(result) -> str:
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "command, flags, error",
    [
        ("knn", ["-k", "0"], "error: argument -k: must be at least 1, got 0"),
        ("knn", ["-k", "-3"], "error: argument -k: must be at least 1, got -3"),
        ("knn", ["--temperature", "0"], "error: argument --temperature: must be above 0, got 0"),
        ("knn", ["--temperature", "-1"], "error: argument --temperature: must be above 0, got -1"),
        ("probe", ["--views", "0"], "error: argument --views: must be at least 1, got 0"),
        ("probe", ["--seed", "-1"], "error: argument --seed: must be at least 0, got -1"),
        ("probe", ["--holdout", "1"], "error: argument --holdout: must be strictly between 0 and 1, got 1"),
    ],
)
def test_evaluation_commands__a_value_out_of_range_is_refused_in_one_line_naming_the_option(
    checkpoint, data, command, flags, error
):
    result = run_mae(command, "--checkpoint", str(checkpoint), *data, *flags, check=False)
    assert last_error(result) == error
    assert "top-1" not in result.stdout


def test_knn_command__k_above_the_memory_bank_is_lowered_with_a_note_and_extraction_shows_progress(
    checkpoint, data
):
    result = run_mae("knn", "--checkpoint", str(checkpoint), *data, "-k", "100")
    assert (
        "note: k=100 neighbours, but the memory bank holds 12 training images: all 12 vote" in result.stderr
    )
    # not a terminal: a line every 30 s and one at the end
    assert "kNN: features of the training split: 12/12 images (100%)" in result.stderr
    assert "kNN: features of the validation split: 6/6 images (100%)" in result.stderr
    assert "on 6 validation images, block 1 of 1: top-1" in result.stdout


def _pretraining_config(tmp_path, **sections) -> dict:
    return {
        "seed_everything": 0,
        "model": {**TINY_MODEL, "optim": {"warmup_epochs": 0}},
        "data": {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 16, "batch_size": 16}},
        "trainer": {
            "max_epochs": -1,
            "max_steps": 2,
            "accelerator": "cpu",
            "devices": 1,
            "logger": False,
            "limit_val_batches": 0,
            "default_root_dir": str(tmp_path / "run"),
        },
        **sections,
    }


@pytest.mark.parametrize(
    "flag, error",
    [
        ("--knn.k=0", 'Parser key "knn.k"'),
        ("--knn.temperature=0", 'Parser key "knn.temperature"'),
        ("--knn.max_train=0", 'Parser key "knn.max_train"'),
        ("--probe.max_val=0", 'Parser key "probe.max_val"'),
    ],
)
def test_pretrain__a_monitor_setting_out_of_range_is_refused_at_start_up_naming_its_key(
    tmp_path, flag, error
):
    config = _pretraining_config(tmp_path, knn={"every_n_epochs": 1})
    result = run_mae("pretrain", flag, config=config, tmp=tmp_path, check=False)
    assert result.returncode == 2 and error in result.stderr, result.stderr[-3000:]
    assert "restriction v>0" in result.stderr
    assert not (tmp_path / "run").exists()  # refused before the run began


def test_pretrain__the_monitors_say_what_they_extract_and_how_to_limit_it_and_show_progress(tmp_path):
    """Digits: 1,437 training and 360 validation images; the monitors' caps limit both."""
    knn = {"every_n_epochs": 1, "k": 5, "max_train": 40, "max_val": 30}
    probe = {"every_n_epochs": 1, "max_epochs": 2, "max_train": 50, "max_val": 20}
    config = _pretraining_config(tmp_path, knn=knn, probe=probe)
    result = run_mae("pretrain", "--trainer.enable_progress_bar=true", config=config, tmp=tmp_path)
    said = result.stdout + result.stderr
    assert (
        "kNN monitor: extracting features of 30 validation and 40 training images (knn.max_val, "
        "knn.max_train limit them; knn.every_n_epochs: 0 turns it off)" in said
    )
    assert (
        "linear probe monitor: extracting features of 20 validation and 50 training images, then training "
        "the heads (probe.max_val, probe.max_train limit them, probe.max_epochs the heads' epochs; "
        "probe.every_n_epochs: 0 turns it off)" in said
    )
    for progress in (
        "kNN: features of the training split: 40/40 images (100%)",
        "kNN: features of the validation split: 30/30 images (100%)",
        "linear probe: features of the training split: 50/50 images (100%)",
        "linear probe: features of the validation split: 20/20 images (100%)",
        "linear probe: training the heads: ",
    ):
        assert progress in result.stderr, progress
