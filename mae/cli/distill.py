"""``mae distill --config CONFIG``: TinyMIM relation distillation of a frozen teacher into a plain timm ViT
student (LightningCLI, ``mae.cli.lightning``; the module: ``mae.training.distill``)."""

from lightning.pytorch.cli import LightningArgumentParser

from mae.cli.lightning import DistillCLI, build, cli_parser, fit
from mae.training.distill import MAEDistillModule


def main(args: list[str] | None = None) -> DistillCLI:
    """Parse the config, read the teacher, build the student, data and trainer, train, and print where the
    outputs are."""
    cli, ckpt_path = build(DistillCLI, MAEDistillModule, "distill", args)
    fit(cli, ckpt_path)
    return cli


def build_parser() -> LightningArgumentParser:
    return cli_parser(DistillCLI, MAEDistillModule, "distill")
