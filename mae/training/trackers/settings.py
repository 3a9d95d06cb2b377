"""What a tracker shows as the run's hyperparameters (``run_settings``), and the package versions among
them."""

from importlib import metadata
from typing import Any

import lightning.pytorch as pl

VERSIONED_PACKAGES = ("torch", "torchvision", "timm", "lightning", "mae-lightning")
NOT_INSTALLED = "not installed"


def package_versions(packages: tuple[str, ...] = VERSIONED_PACKAGES) -> dict[str, str]:
    """Versions of ``packages`` (default: those a run's numbers depend on), ``not
    installed`` where missing."""
    versions = {}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = NOT_INSTALLED
    return versions


def run_settings(
    config: dict[str, Any], pl_module: pl.LightningModule, trainer: pl.Trainer
) -> dict[str, Any]:
    """What a tracker shows as the run's hyperparameters: ``config`` (the resolved command-line config,
    without ``ckpt_path``, which changes between a run and its resume), the effective batch and lr
    (known once the optimizer is built), the architecture record and the package versions."""
    settings: dict[str, Any] = {
        "config": {k: v for k, v in config.items() if k not in ("ckpt_path", "config")}
    }
    effective_batch = getattr(pl_module, "effective_batch", None)
    if effective_batch is not None:
        settings["run"] = {
            "effective_batch": effective_batch,
            "lr": pl_module.resolved_lr,
            "devices": trainer.num_devices,
            "nodes": trainer.num_nodes,
            "precision": str(trainer.precision),
        }
    record = getattr(pl_module, "architecture_record", None)
    if callable(record):
        settings["architecture"] = record()
    settings["versions"] = package_versions()
    return settings
