"""``mae replay <run>/nonfinite/step_<N>``: run again a training step that went non-finite, from what the run
kept of it (``mae.training.replay``), and name the first module whose output is non-finite."""

from pathlib import Path

from jsonargparse import ArgumentParser, Namespace

from mae.cli.command import command_parser, parse_and_run


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "mae replay",
        "Replay a training step kept when its loss or a gradient went non-finite (the folder the error "
        "named), with a forward hook on every module; prints the first module whose output is non-finite. "
        "Runs on the device the step ran on when there is one, else on the CPU.",
    )
    parser.add_argument("folder", type=Path, help="the capture folder: <run>/nonfinite/step_<N>")
    return parser


def training_modules() -> dict[str, type]:
    """The training modules a capture folder's ``step.json`` may name, by the class path the capture
    callback records (``module_class``): the module of each training command."""
    from mae.dense.tasks.detection import MAEDetectionModule
    from mae.dense.tasks.segmentation import MAESegmentationModule
    from mae.training.distill import MAEDistillModule
    from mae.training.finetune import MAEFinetuneModule
    from mae.training.pretrain import MAEPretrainModule

    modules = (
        MAEPretrainModule,
        MAEDistillModule,
        MAEFinetuneModule,
        MAEDetectionModule,
        MAESegmentationModule,
    )
    return {f"{module.__module__}.{module.__qualname__}": module for module in modules}


def run(args: Namespace) -> str:
    """Print and return what the replay found."""
    from mae.training.replay import replay_capture

    finding, record = replay_capture(args.folder, training_modules())
    line = (
        f"{args.folder}: step {record.get('step')} (epoch {record.get('epoch')}), non-finite "
        f"{record.get('reason', 'loss')}, replayed in {record['precision']}: {finding.describe()}"
    )
    print(line, flush=True)
    return line


def main(argv: list[str] | None = None) -> str:
    return parse_and_run(build_parser(), run, argv)
