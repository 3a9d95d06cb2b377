"""The fast linear probe: many heads on cached features, chosen on held-out training images."""

import copy
import functools

import numpy as np
import pytest
import torch
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression

from mae.cli.main import invoke
from mae.eval.probe import FeatureStore, ProbeResult, pooled, train_probe
from tests.helpers import (
    TINY_MODEL,
    TWO_BLOCK_KWARGS,
    csv_logger,
    folder_flags,
    read_metrics,
    tiny_pretraining_checkpoint,
    write_config,
    write_image_folder,
)


def _problem(separation: float, seed: int) -> tuple[FeatureStore, FeatureStore, np.ndarray]:
    x, y = make_classification(
        n_samples=4000,
        n_features=64,
        n_informative=24,
        n_classes=10,
        n_clusters_per_class=1,
        class_sep=separation,
        random_state=seed,
    )
    x = x.astype(np.float32) * 3 + 1  # not standardised: the probe must do it
    return FeatureStore(x[:3000], y[:3000]), FeatureStore(x[3000:], y[3000:]), x


def _probe(separation: float, seed: int) -> ProbeResult:
    """``train_probe`` of ``_problem(separation, seed)`` with 10 classes, run once a session (2-3 s; the tests
    that compare with it run it again where they test that a run repeats), a copy of its own each call."""
    return copy.deepcopy(_probe_once(separation, seed))


@functools.cache
def _probe_once(separation: float, seed: int) -> ProbeResult:
    train, val, _ = _problem(separation, seed)
    return train_probe(train, val, 10)


@pytest.mark.parametrize("separation, seed", [(1.0, 0), pytest.param(1.5, 1, marks=pytest.mark.slow)])
def test_probe__reaches_logistic_regression_within_one_point(separation, seed):
    train, val, _ = _problem(separation, seed)
    ours = _probe(separation, seed)
    reference = LogisticRegression(max_iter=3000).fit(train.feats, train.labels)
    assert abs(ours.val_acc1 - 100 * reference.score(val.feats, val.labels)) <= 1.0
    assert ours.epochs < 100 and len(ours.grid) == 18  # converged (early stop), 6 lrs x 3 weight decays


@pytest.mark.slow
def test_probe__selection_never_looks_at_the_validation_split_and_is_deterministic():
    train, val, _ = _problem(1.0, 0)
    first = _probe(1.0, 0)
    assert train_probe(train, val, 10) == first  # same seed, same everything
    shuffled = FeatureStore(val.feats, np.random.default_rng(0).permutation(val.labels))
    blind = train_probe(train, shuffled, 10)
    assert (blind.lr, blind.weight_decay, blind.epochs, blind.holdout_acc1, blind.grid) == (
        first.lr,
        first.weight_decay,
        first.epochs,
        first.holdout_acc1,
        first.grid,
    )
    assert blind.val_acc1 < first.val_acc1 - 20  # only the score changed


@pytest.mark.slow
def test_probe__features_on_disk_read_in_chunks_give_the_same_result(tmp_path):
    train, val, x = _problem(1.0, 0)
    images = torch.utils.data.TensorDataset(torch.from_numpy(x[:3000]), torch.from_numpy(train.labels))
    on_disk = FeatureStore.extract(lambda f: f * 1.0, images, batch_size=500, cache=tmp_path / "feats")
    assert isinstance(on_disk.feats, np.memmap) and (tmp_path / "feats.feats.npy").is_file()
    assert train_probe(on_disk, val, 10, chunk=512) == _probe(1.0, 0)  # 512 of 3000 rows at a time


def test_probe__grid_and_pool_errors_name_the_setting():
    train, val, _ = _problem(1.0, 0)
    with pytest.raises(ValueError, match=r"probe.lrs must be positive"):
        train_probe(train, val, 10, lrs=(0.1, 0.0))
    with pytest.raises(ValueError, match=r"probe.weight_decays must be >= 0"):
        train_probe(train, val, 10, weight_decays=(-1.0,))
    with pytest.raises(ValueError, match="probe.pool"):
        pooled(torch.nn.Identity(), "max")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probe")
    tiny_pretraining_checkpoint(tmp)
    write_image_folder(tmp / "data" / "train", ["a", "b", "c"], per_class=8, size=(20, 20))
    write_image_folder(tmp / "data" / "val", ["a", "b", "c"], per_class=3, size=(20, 20), seed=1)
    return tmp


@pytest.mark.parametrize("pool, extra", [("cls", []), ("both", ["--views", "2"])])
def test_probe_command__on_a_checkpoint_and_a_folder(checkpoint, pool, extra, tmp_path, capsys):
    data = folder_flags(checkpoint / "data", batch_size=8)
    result = invoke(
        "probe",
        [
            "--checkpoint",
            str(checkpoint / "last.ckpt"),
            *data,
            "--pool",
            pool,
            *extra,
            "--cache",
            str(tmp_path / "cache"),
        ],
    )
    assert 0 <= result.val_acc1 <= 100 and "on 9 validation images" in capsys.readouterr().out
    assert (tmp_path / "cache.train.feats.npy").is_file()
    views = 2 if extra else 1
    assert np.load(tmp_path / "cache.train.feats.npy").shape == (
        24 * views,
        32 * (2 if pool == "both" else 1),
    )


def test_probe_command__feature_blocks_concatenated_and_checked_before_any_extraction(
    checkpoint, tmp_path, capsys
):
    tiny_pretraining_checkpoint(tmp_path, model_kwargs=TWO_BLOCK_KWARGS)  # 2 blocks, width 32
    data = folder_flags(checkpoint / "data", batch_size=8)
    args = ["--checkpoint", str(tmp_path / "last.ckpt"), *data, "--cache", str(tmp_path / "cache")]
    invoke("probe", [*args, "--feature-blocks", "0", "-1", "--max-epochs", "2"])
    assert "cls features of blocks 1+2 of 2 (concatenated), 24 training views" in capsys.readouterr().out
    assert np.load(tmp_path / "cache.train.feats.npy").shape == (24, 2 * 32)
    invoke("probe", [*args, "--max-epochs", "2"])
    assert "cls features of block 2 of 2, 24 training views" in capsys.readouterr().out
    (tmp_path / "cache.train.feats.npy").unlink()
    with pytest.raises(ValueError, match="--feature-blocks 2 is not a block of this encoder of depth 2"):
        invoke("probe", [*args, "--feature-blocks", "2"])
    assert not (tmp_path / "cache.train.feats.npy").exists()


def test_probe_command__a_cache_prefix_over_the_users_files_is_refused_its_own_reused(
    checkpoint, tmp_path, capsys
):
    data = folder_flags(checkpoint / "data", batch_size=8)
    args = ["--checkpoint", str(checkpoint / "last.ckpt"), *data, "--cache", str(tmp_path / "cache")]
    invoke("probe", args)
    invoke("probe", args)  # its own cache files are replaced
    (tmp_path / "mine.val.labels.npy").write_text("my labels\n")
    args[-1] = str(tmp_path / "mine")
    with pytest.raises(
        ValueError, match=r"--cache .*mine.val.labels.npy holds a file that no run of mae probe wrote"
    ):
        invoke("probe", args)
    assert (tmp_path / "mine.val.labels.npy").read_text() == "my labels\n"
    assert not (tmp_path / "mine.train.feats.npy").exists()


def test_probe_command__needs_labels_an_encoder_and_a_positive_lr(checkpoint, tmp_path):
    one_class = tmp_path / "one"
    write_image_folder(one_class / "train", ["only"], per_class=4)
    write_image_folder(one_class / "val", ["only"], per_class=2)
    with pytest.raises(ValueError, match="needs labelled data with 2 or more classes"):
        invoke("probe", ["--checkpoint", str(checkpoint / "last.ckpt"), *folder_flags(one_class)])
    (tmp_path / "notes.ckpt").write_text("an encoder lives here")
    data = folder_flags(checkpoint / "data")
    with pytest.raises(ValueError, match="notes.ckpt is not a PyTorch/safetensors checkpoint"):
        invoke("probe", ["--checkpoint", str(tmp_path / "notes.ckpt"), *data])
    with pytest.raises(ValueError, match="probe.lrs must be positive"):
        invoke("probe", ["--checkpoint", str(checkpoint / "last.ckpt"), *data, "--lrs", "[0.1, -1]"])


def test_probe_monitor__logged_during_pretraining(checkpoint, tmp_path):
    config = {
        "seed_everything": 0,
        "model": {**TINY_MODEL, "optim": {"warmup_epochs": 0}},
        "data": {
            "class_path": "mae.data.ImageFolderDataModule",
            "init_args": {
                "root": str(checkpoint / "data"),
                "img_size": 16,
                "batch_size": 8,
                "num_workers": 0,
            },
        },
        "trainer": {
            "max_epochs": 2,
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "log_every_n_steps": 1,
            "logger": csv_logger(tmp_path, "probe"),
        },
        "reconstruction": {"every_n_epochs": 0},
        "probe": {"every_n_epochs": 1, "max_epochs": 5},
    }
    invoke("pretrain", ["--config", str(write_config(tmp_path, config, "probe"))])
    rows = [r for r in read_metrics(tmp_path / "runs" / "probe" / "version_0") if r.get("val/probe_acc1")]
    assert len(rows) == 2 and all(0 <= float(r["val/probe_acc1"]) <= 100 for r in rows)


def test_probe__augmented_views_of_a_held_out_image_are_never_trained_on(monkeypatch):
    import mae.eval.probe as probe

    train, val, _ = _problem(1.0, 0)
    two_views = FeatureStore(
        np.concatenate([train.feats, train.feats + 0.01]), np.concatenate([train.labels] * 2), 2
    )
    seen = {}
    split, moments = probe._stratified_split, probe.feature_moments
    monkeypatch.setattr(probe, "_stratified_split", lambda *a: seen.setdefault("split", split(*a)))
    monkeypatch.setattr(
        probe,
        "feature_moments",
        lambda store, rows, chunk: seen.setdefault("fit", rows) is not None and moments(store, rows, chunk),
    )
    result = train_probe(two_views, val, 10, max_epochs=2)
    fit_images, held_images = seen["split"]
    assert len(held_images) > 250 and set(fit_images).isdisjoint(held_images)
    fit_rows = seen["fit"]
    assert len(fit_rows) == 2 * len(fit_images) and set(fit_rows % 3000) == set(
        fit_images
    )  # both views, no held
    assert 0 <= result.val_acc1 <= 100
