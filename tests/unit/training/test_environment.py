"""What ``mae env`` reports about the machine (``mae.training.environment``)."""

from mae.training.environment import CORE_PACKAGES, environment


def test_environment__versions_device_and_the_default_run_in_order():
    info = environment()
    assert list(info)[:2] == ["python", "platform"]
    assert all(package in info for package in CORE_PACKAGES)
    assert {"extras", "device", "bf16", "default run"} <= set(info)
    assert info["default run"].startswith("trainer.precision ")
