"""Run folders: each fresh run claims a ``version_N`` folder of its own before anything is written
(``mae.training.resume.claim_run_folder`` / ``start_run_folder``); two real runs started together are in
``tests/integration/pretrain/test_interrupts.py``; where its checkpoints will go, checked before any work
(``checkpoint_folder``)."""

import threading

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from mae.compat.lightning import version_chosen
from mae.training.resume import ShareRunVersion, checkpoint_folder, claim_run_folder, start_run_folder


def test_claim_run_folder__threads_racing_for_one_root_each_get_their_own_version(tmp_path):
    root = tmp_path / "runs" / "name"
    (root / "version_3").mkdir(parents=True)  # an earlier run's
    (root / "version_x").mkdir()  # a named version: not counted
    (root / "version_4").touch()  # a file, not a run folder: skipped
    claimed, start = [], threading.Barrier(8)

    def claim():
        start.wait()
        claimed.append(claim_run_folder(root)[0])

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed) == list(range(5, 13))
    assert all((root / f"version_{n}").is_dir() for n in claimed)


def test_claim_run_folder__names_the_folders_above_it_that_it_made(tmp_path):
    (tmp_path / "runs").mkdir()
    assert claim_run_folder(tmp_path / "runs" / "a" / "b") == (
        0,
        [tmp_path / "runs" / "a" / "b", tmp_path / "runs" / "a"],
    )
    assert claim_run_folder(tmp_path / "runs" / "a" / "b") == (1, [])


def _trainer(tmp_path, **logger) -> pl.Trainer:
    return pl.Trainer(logger=CSVLogger(tmp_path / "runs", name="run", **logger), default_root_dir=tmp_path)


def test_start_run_folder__a_fresh_run_claims_the_next_version(tmp_path):
    (tmp_path / "runs" / "run" / "version_0").mkdir(parents=True)
    trainer = _trainer(tmp_path)
    folder, made = start_run_folder(trainer)
    assert folder == tmp_path / "runs" / "run" / "version_1" and folder.is_dir() and made == []
    assert trainer.logger.version == 1 and isinstance(trainer.callbacks[0], ShareRunVersion)


def test_start_run_folder__a_given_version_is_kept_and_not_made(tmp_path):
    trainer = _trainer(tmp_path, version="mine")
    folder, made = start_run_folder(trainer)
    assert folder == tmp_path / "runs" / "run" / "mine" and not folder.exists()
    assert made == [tmp_path / "runs" / "run", tmp_path / "runs"]
    assert not any(isinstance(c, ShareRunVersion) for c in trainer.callbacks)
    folder.mkdir(parents=True)  # an existing folder (a resumed run's): not this run's to remove
    assert start_run_folder(_trainer(tmp_path, version="mine")) is None


def test_checkpoint_folder__where_lightning_will_write_found_without_choosing_the_version(tmp_path):
    (tmp_path / "runs" / "run" / "version_0").mkdir(parents=True)
    trainer = _trainer(tmp_path)
    assert checkpoint_folder(trainer) == (
        tmp_path / "runs" / "run" / "version_1" / "checkpoints",
        "the checkpoint folder",
    )
    assert not version_chosen(trainer.logger)  # still claimed only when the run starts
    given = pl.Trainer(logger=False, callbacks=[ModelCheckpoint(dirpath=tmp_path / "mine")])
    assert checkpoint_folder(given) == (tmp_path / "mine", "checkpoint.dirpath")
    bare = pl.Trainer(logger=False, default_root_dir=tmp_path)
    assert checkpoint_folder(bare) == (tmp_path / "checkpoints", "the checkpoint folder")
    assert checkpoint_folder(pl.Trainer(logger=False, enable_checkpointing=False)) is None
