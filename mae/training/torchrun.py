"""A run started by ``torchrun`` checked against the trainer's devices before any work."""

import os

import lightning.pytorch as pl
from lightning.fabric.plugins.environments import TorchElasticEnvironment

from mae.errors import ConfigError


def check_torchrun_processes(trainer: pl.Trainer) -> None:
    """Refuse a run that ``torchrun`` started as more or fewer processes than ``trainer.num_nodes`` x
    ``trainer.devices``: with one device on one node Lightning would train each process alone, all of them
    writing the same run folder; with more it would fail at launch.

    Raises:
        ConfigError: torchrun's ``WORLD_SIZE`` (``--nnodes`` x ``--nproc-per-node``) is not
            ``trainer.num_nodes`` x ``trainer.devices``.
    """
    if not TorchElasticEnvironment.detect():
        return
    world, per_node = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if world != trainer.num_nodes * trainer.num_devices:
        raise ConfigError(
            f"torchrun started {world} processes ({world // per_node} node(s) x {per_node}) but "
            f"trainer.num_nodes x trainer.devices is {trainer.num_nodes} x {trainer.num_devices}: set "
            f"--trainer.num_nodes {world // per_node} --trainer.devices {per_node}"
        )
