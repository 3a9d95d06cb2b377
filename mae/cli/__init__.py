"""Every command, one module each, and ``main`` (the ``mae`` command) over them; ``commands`` is the one
table of subcommands. The LightningCLI commands (``pretrain``, ``finetune``, ``detect``, ``segment``) are
built in ``lightning``; every other is a ``build_parser()`` / ``run(args)`` / ``main(argv)`` as
``mae.command`` describes (the data layer's ``shard`` and ``stats`` live in ``mae.data.tools``).

The names below (``pretrain_main``, ...: what the root launchers and ``python -m mae.<command>`` run)
are imported on first use, so ``mae --help`` imports no command."""

import importlib

# name -> "module:attribute"
_LAZY = {
    "anomaly_main": "mae.cli.anomaly:main",
    "demo_main": "mae.cli.demo:main",
    "detect_main": "mae.cli.dense:detect_main",
    "embed_main": "mae.cli.embed:main",
    "export_main": "mae.cli.export:main",
    "finetune_main": "mae.cli.finetune:main",
    "knn_main": "mae.cli.knn:main",
    "pretrain_main": "mae.cli.train:main",
    "probe_main": "mae.cli.probe:main",
    "reconstruct_main": "mae.cli.reconstruct:main",
    "search_main": "mae.cli.search:main",
    "segment_main": "mae.cli.dense:segment_main",
    "FinetuneCLI": "mae.cli.lightning:FinetuneCLI",
    "PretrainCLI": "mae.cli.lightning:PretrainCLI",
    "expand_stacked_configs": "mae.cli.lightning:expand_stacked_configs",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'mae.cli' has no attribute {name!r}")
    module, attribute = _LAZY[name].split(":")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
