"""``mae pretrain --config CONFIG``: MAE pretraining (LightningCLI, ``mae.cli.lightning``)."""

from lightning.pytorch.cli import LightningArgumentParser

from mae.cli.batch_size import find_batch_size
from mae.cli.lightning import PretrainCLI, build, cli_parser, fit
from mae.training.pretrain import MAEPretrainModule


def main(args: list[str] | None = None) -> PretrainCLI:
    """Parse the config, build model/data/trainer, train, and print where the outputs are (or, with
    ``--find_batch_size``, only find the largest batch that fits)."""
    cli, ckpt_path = build(PretrainCLI, MAEPretrainModule, "pretrain", args)
    if cli.config.find_batch_size:
        find_batch_size(cli, ckpt_path, cli.config.find_batch_size_max_trials)
        return cli
    fit(cli, ckpt_path)
    return cli


def build_parser() -> LightningArgumentParser:
    return cli_parser(PretrainCLI, MAEPretrainModule, "pretrain")
