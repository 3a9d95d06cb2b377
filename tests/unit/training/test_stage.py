"""A stage of a run in a run folder of its own (``mae.training.stage``): a run that never took a step leaves
no run folder behind; one that wrote more than its start-up files keeps it. The exit statuses of SIGTERM and
Ctrl-C are checked on real runs in ``tests/integration/pretrain/test_interrupts.py``."""

from mae.training.stage import BEFORE_FIRST_STEP, remove_unused_run_folder


def test_remove_unused_run_folder__only_start_up_files__folder_and_its_new_empty_parents_go(tmp_path):
    parent = tmp_path / "runs" / "name"
    folder = parent / "version_0"
    folder.mkdir(parents=True)
    for name in BEFORE_FIRST_STEP:
        (folder / name).write_text("x")
    remove_unused_run_folder(folder, [parent, tmp_path / "runs"])
    assert not (tmp_path / "runs").exists()


def test_remove_unused_run_folder__anything_else_keeps_the_folder_and_parents_not_made_stay(tmp_path):
    folder = tmp_path / "runs" / "version_0"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.yaml").write_text("x")
    remove_unused_run_folder(folder, [tmp_path / "runs"])
    assert (folder / "config.yaml").is_file() and (folder / "checkpoints").is_dir()
    other = tmp_path / "other" / "version_1"
    other.mkdir(parents=True)
    (tmp_path / "other" / "version_0").mkdir()  # an earlier run's: the parent is not left empty
    remove_unused_run_folder(other, [tmp_path / "other"])
    assert not other.exists() and (tmp_path / "other" / "version_0").is_dir()
