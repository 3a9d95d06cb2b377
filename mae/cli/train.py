"""``mae pretrain --config CONFIG``: MAE pretraining (LightningCLI, ``mae.cli.lightning``)."""

from lightning.pytorch.cli import LightningArgumentParser

from mae.cli.lightning import PretrainCLI, build, cli_parser, fit
from mae.training.pretrain import MAEPretrainModule


def main(args: list[str] | None = None) -> PretrainCLI:
    """Parse the config, build model/data/trainer, train, and print where the outputs are."""
    cli, ckpt_path = build(PretrainCLI, MAEPretrainModule, "pretrain", args)
    fit(cli, ckpt_path)
    return cli


def build_parser() -> LightningArgumentParser:
    return cli_parser(PretrainCLI, MAEPretrainModule, "pretrain")
