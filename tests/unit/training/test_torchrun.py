"""A run started by torchrun is refused before any work when its process count is not the trainer's
nodes x devices (``mae.training.torchrun``)."""

from types import SimpleNamespace

import pytest

from mae.errors import ConfigError
from mae.training.torchrun import check_torchrun_processes


def _torchrun(monkeypatch, world: int, per_node: int) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))


def test_check_torchrun_processes__as_many_processes_as_nodes_x_devices_pass(monkeypatch):
    _torchrun(monkeypatch, 4, 2)
    check_torchrun_processes(SimpleNamespace(num_nodes=2, num_devices=2))


def test_check_torchrun_processes__another_count_names_the_settings_to_use(monkeypatch):
    _torchrun(monkeypatch, 4, 2)
    expected = r"torchrun started 4 processes \(2 node\(s\) x 2\) but .* is 1 x 1: set --trainer.num_nodes 2 "
    with pytest.raises(ConfigError, match=expected + "--trainer.devices 2"):
        check_torchrun_processes(SimpleNamespace(num_nodes=1, num_devices=1))


def test_check_torchrun_processes__without_torchrun_nothing_is_checked(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    check_torchrun_processes(SimpleNamespace(num_nodes=1, num_devices=1))
