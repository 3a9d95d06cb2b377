"""``mae detect --config CONFIG`` and ``mae segment --config CONFIG``: detection / instance
segmentation and semantic segmentation from a pretrained encoder (LightningCLI, ``mae.cli.lightning``)."""

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningArgumentParser

from mae.cli.lightning import DenseCLI, SegmentCLI, build, cli_parser, fit, run
from mae.dense.tasks.detection import MAEDetectionModule
from mae.dense.tasks.segmentation import MAESegmentationModule
from mae.training.run_summary import print_metrics


def _main(cli_class: type[DenseCLI], module: type, run_name: str, args: list[str] | None) -> DenseCLI:
    cli, ckpt_path = build(cli_class, module, run_name, args, pl.LightningDataModule)
    if cli.config.validate_only:
        results = run(cli, "validate", ckpt_path)
        print_metrics(results[0] if results else {})
        return cli
    fit(cli, ckpt_path)
    print_metrics(cli.trainer.callback_metrics)
    return cli


def detect_main(args: list[str] | None = None) -> DenseCLI:
    """Train a detector (or only evaluate one), then print the validation mAP and where the outputs are."""
    return _main(DenseCLI, MAEDetectionModule, "detect", args)


def segment_main(args: list[str] | None = None) -> SegmentCLI:
    """Train a segmenter (or only evaluate one), then print the validation mIoU and where the outputs are."""
    return _main(SegmentCLI, MAESegmentationModule, "segment", args)


def detect_parser() -> LightningArgumentParser:
    return cli_parser(DenseCLI, MAEDetectionModule, "detect", pl.LightningDataModule)


def segment_parser() -> LightningArgumentParser:
    return cli_parser(SegmentCLI, MAESegmentationModule, "segment", pl.LightningDataModule)
