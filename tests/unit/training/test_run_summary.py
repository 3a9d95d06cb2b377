"""What a finished run prints (``mae.training.run_summary``): where its outputs are, the loss per epoch,
the figures of the callbacks it is given, and the validation metrics in one line."""

from types import SimpleNamespace

from mae.training.run_summary import print_accuracy, print_metrics, run_summary


class _Figures:
    def __init__(self, last_path):
        self.last_path = last_path


def test_run_summary__names_the_files_there_the_checkpoints_figures_and_losses(tmp_path):
    (tmp_path / "config.yaml").write_text("x")  # metrics.csv is not there: not named
    checkpoint = SimpleNamespace(last_model_path="last.ckpt", best_model_path="best.ckpt", monitor="val/acc1")
    trainer = SimpleNamespace(
        checkpoint_callback=checkpoint,
        callbacks=[_Figures(None), _Figures("figures/epoch_1.png")],
        loggers=[],
        lightning_module=SimpleNamespace(epoch_losses=[1.5, 0.25], resolution_summary=None),
    )
    lines = run_summary(trainer, tmp_path, ((_Figures, "figures"),))
    assert lines == [
        f"Run folder: {tmp_path}",
        f"  config:           {tmp_path / 'config.yaml'}",
        "  last checkpoint:  last.ckpt",
        "  best checkpoint:  best.ckpt (val/acc1)",
        "  figures:          figures/epoch_1.png",
        "  train loss per epoch: 1.5000 -> 0.2500",
    ]


def test_print_metrics_and_accuracy__one_line_each(capsys):
    print_metrics({"val/map": 0.43125, "train/loss": 1.0, "val/map_50": 0.5})
    print_accuracy({"val/acc1": 0.5, "val/acc5": 0.875})
    print_accuracy({})  # nothing to say
    assert (
        capsys.readouterr().out
        == "validation: val/map 0.4313, val/map_50 0.5000\nvalidation top-1 50.00%, top-5 87.50%\n"
    )
