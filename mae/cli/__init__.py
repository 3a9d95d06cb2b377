"""Every command-line entry point, one module each: ``train``, ``finetune`` and ``dense`` (``train.py``,
``finetune.py``, ``detect.py`` and ``segment.py``, LightningCLI, built in ``lightning``), and ``export``,
``knn``, ``probe``, ``reconstruct``, ``demo``, ``embed``, ``search``, ``anomaly`` (``python -m mae.<command>``),
each a ``build_parser()`` / ``run(args)`` / ``main(argv)`` as ``mae.command`` describes. The data layer's own
commands (``python -m mae.data.shard``, ``mae.data.stats``) are written the same way, in ``mae.data.tools``."""

from mae.cli.anomaly import main as anomaly_main
from mae.cli.demo import main as demo_main
from mae.cli.embed import main as embed_main
from mae.cli.export import main as export_main
from mae.cli.finetune import main as finetune_main
from mae.cli.knn import main as knn_main
from mae.cli.lightning import FinetuneCLI, PretrainCLI, expand_stacked_configs
from mae.cli.probe import main as probe_main
from mae.cli.reconstruct import main as reconstruct_main
from mae.cli.search import main as search_main
from mae.cli.train import main as pretrain_main

__all__ = [
    "FinetuneCLI",
    "PretrainCLI",
    "anomaly_main",
    "demo_main",
    "embed_main",
    "expand_stacked_configs",
    "export_main",
    "finetune_main",
    "knn_main",
    "pretrain_main",
    "probe_main",
    "reconstruct_main",
    "search_main",
]
