"""``mae finetune --config CONFIG``: fine-tuning or linear probing with the paper's recipe, the joint
objective of classification and MAE reconstruction (``model.mode: joint``; ``--config default_joint``), or
only evaluating a fine-tuned checkpoint (LightningCLI, ``mae.cli.lightning``)."""

from lightning.pytorch.cli import LightningArgumentParser

from mae.cli.lightning import FinetuneCLI, build, cli_parser, fit, run
from mae.training.callbacks import KNNCallback, ProbeCallback
from mae.training.finetune import MAEFinetuneModule
from mae.training.run_summary import print_accuracy


class FinetuneMonitorsCLI(FinetuneCLI):
    """``mae finetune``'s LightningCLI: ``FinetuneCLI`` with the encoder's kNN and linear-probe monitors
    (``knn.every_n_epochs``, ``probe.every_n_epochs``; off by default), as ``mae pretrain`` has them: in
    joint mode they watch the representation the reconstruction trains."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_lightning_class_args(KNNCallback, "knn")
        parser.set_defaults({"knn.every_n_epochs": 0})
        parser.add_lightning_class_args(ProbeCallback, "probe")


def main(args: list[str] | None = None) -> FinetuneCLI:
    """Fine-tune / linear-probe / train jointly (or only evaluate), then print top-1 / top-5 and where the
    outputs are."""
    cli, ckpt_path = build(FinetuneMonitorsCLI, MAEFinetuneModule, "finetune", args)
    if cli.config.validate_only:
        results = run(cli, "validate", ckpt_path)
        print_accuracy(results[0] if results else {})
        return cli
    fit(cli, ckpt_path)
    print_accuracy({k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("val/acc")})
    return cli


def build_parser() -> LightningArgumentParser:
    return cli_parser(FinetuneMonitorsCLI, MAEFinetuneModule, "finetune")
