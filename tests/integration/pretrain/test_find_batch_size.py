"""``mae pretrain --find_batch_size``: Lightning's batch-size search through the command line, its lr by the
paper's rule, and nothing written."""

from tests.helpers import (
    REPO,
    TINY_MODEL,
    csv_logger,
    run_mae,
    tiny_pretraining_checkpoint,
    write_image_folder,
)


def test_find_batch_size__prints_the_batch_and_its_lr_and_writes_nothing(tmp_path):
    write_image_folder(tmp_path / "data" / "train", ["a", "b", "c"], per_class=4)
    config = {
        "seed_everything": 0,
        "model": {**TINY_MODEL, "optim": {"warmup_epochs": 0, "base_lr": 1.5e-4}},
        "data": {
            "class_path": "mae.data.ImageFolderDataModule",
            "init_args": {"root": str(tmp_path / "data"), "img_size": 16, "batch_size": 2, "num_workers": 0},
        },
        "trainer": {
            "max_epochs": 1,
            "accelerator": "cpu",
            "devices": 1,
            "accumulate_grad_batches": 2,
            "enable_progress_bar": False,
            "default_root_dir": str(tmp_path / "root"),
            "logger": csv_logger(tmp_path, "search"),
        },
        "reconstruction": {"every_n_epochs": 0},
    }
    before = set(tmp_path.rglob("*")) | set(REPO.glob(".scale_batch_size_*"))
    result = run_mae(
        "pretrain",
        "--find_batch_size",
        "true",
        "--find_batch_size_max_trials",
        "3",
        config=config,
        tmp=tmp_path,
    )
    # 2 -> 4 -> 8: three tries, all fit on CPU; lr = 1.5e-4 x 8 x 2 accumulation / 256
    assert "largest batch that fits: data.batch_size 8 per device" in result.stdout
    assert "lr by the paper's rule: 9.375e-06 = base_lr 0.00015 x 8 x 2 accumulation x 1 device / 256" in (
        result.stdout
    )
    config_file = {p for p in tmp_path.glob("*.yaml")}
    assert set(tmp_path.rglob("*")) | set(REPO.glob(".scale_batch_size_*")) == before | config_file
    assert "Run folder" not in result.stdout

    # a search does not resume a run
    ckpt = tiny_pretraining_checkpoint(tmp_path / "earlier")
    result = run_mae(
        "pretrain",
        "--find_batch_size",
        "true",
        "--ckpt_path",
        str(ckpt),
        config=config,
        tmp=tmp_path,
        check=False,
    )
    assert result.returncode == 2
    assert "error: --find_batch_size: leave out --ckpt_path" in result.stderr
