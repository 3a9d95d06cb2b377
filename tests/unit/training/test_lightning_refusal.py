"""Lightning refusing a setting as the ``ConfigError`` of its key (``mae.training.lightning_refusal``), and
an error of the project's own code left as it is (a bug keeps its traceback). The training commands' one
error line is checked end to end in ``tests/integration/commands/test_config_errors.py``."""

import lightning.pytorch as pl
from jsonargparse import ArgumentParser

from mae.errors import ConfigError
from mae.training.lightning_refusal import lightning_refusal


def _raised(build):
    try:
        build()
    except Exception as err:  # noqa: BLE001  the error itself is what is checked
        return err
    raise AssertionError("nothing was raised")


def test_lightning_refusal__the_trainer_refusing_a_setting_names_its_key():
    parser = ArgumentParser()
    parser.add_class_arguments(pl.Trainer, "trainer", instantiate=True)
    config = parser.parse_args(["--trainer.max_epochs=-5", "--trainer.logger=false"])
    refusal = lightning_refusal(_raised(lambda: parser.instantiate_classes(config)))
    assert isinstance(refusal, ConfigError)
    assert str(refusal).startswith("trainer.max_epochs: ")
    assert "refused by Lightning's Trainer" in str(refusal)


def test_lightning_refusal__an_error_of_our_own_code_or_a_project_error_is_left_alone():
    def ours():
        raise ValueError("a bug in the project")

    assert lightning_refusal(_raised(ours)) is None
    assert lightning_refusal(_raised(lambda: (_ for _ in ()).throw(ConfigError("x")))) is None
