"""``mae finetune --config CONFIG``: fine-tuning or linear probing with the paper's recipe, or
only evaluating a fine-tuned checkpoint (LightningCLI, ``mae.cli.lightning``)."""

from lightning.pytorch.cli import LightningArgumentParser

from mae.cli.lightning import FinetuneCLI, build, cli_parser, fit, run
from mae.training.finetune import MAEFinetuneModule
from mae.training.run_summary import print_accuracy


def main(args: list[str] | None = None) -> FinetuneCLI:
    """Fine-tune / linear-probe (or only evaluate), then print top-1 / top-5 and where the outputs are."""
    cli, ckpt_path = build(FinetuneCLI, MAEFinetuneModule, "finetune", args)
    if cli.config.validate_only:
        results = run(cli, "validate", ckpt_path)
        print_accuracy(results[0] if results else {})
        return cli
    fit(cli, ckpt_path)
    print_accuracy({k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("val/acc")})
    return cli


def build_parser() -> LightningArgumentParser:
    return cli_parser(FinetuneCLI, MAEFinetuneModule, "finetune")
