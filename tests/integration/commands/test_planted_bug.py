"""A bug is never shown as a user's mistake: a ``ValueError`` planted in a model function, raised inside the
package by ``mae pretrain`` run as the ``mae`` console script runs it, ends in its traceback and exit status
1; the same run with a user's mistake ends in one ``error:`` line and exit status 2."""

import textwrap

from tests.forked_commands import run_forked
from tests.helpers import REPO

ONE_STEP = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=1",
    "--trainer.limit_val_batches=0",
    "--trainer.enable_progress_bar=false",
    "--model.optim.warmup_epochs=0",
]


def _console(tmp_path, plant: bool, *args: str):
    script = tmp_path / "console.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys
            import mae.models.mae as model_module
            from mae.cli.main import console_main

            def planted(*args, **kwargs):
                raise ValueError("planted bug in forward_loss")

            if os.environ.get("PLANT") == "1":
                model_module.MaskedAutoencoderViT.forward_loss = planted
            os.chdir(sys.argv[1])
            sys.argv = ["mae", *sys.argv[2:]]
            console_main()
            """
        )
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PLANT": "1" if plant else "0"}
    return run_forked([str(script), str(tmp_path), "pretrain", "--config", "default", *args], REPO, 300, env)


def test_a_planted_value_error_prints_its_traceback_and_exits_1(tmp_path):
    result = _console(tmp_path, True, *ONE_STEP)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "ValueError: planted bug in forward_loss"
    assert "error: planted bug" not in result.stderr


def test_a_users_mistake_in_the_same_run_is_one_error_line_with_status_2(tmp_path):
    result = _console(tmp_path, False, *ONE_STEP, "--data.batch_size=0")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "error: data.batch_size must be >= 1, got 0"
