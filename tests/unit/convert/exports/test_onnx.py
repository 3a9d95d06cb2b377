"""The ONNX target's own checks (``mae.convert.exports.onnx``), before any checkpoint is read; the export
itself is ``tests/unit/convert/test_onnx.py``'s."""

import sys
from pathlib import Path

import pytest

from mae.convert.exports import onnx
from mae.convert.exports.base import ExportRequest
from mae.errors import ConfigError, UsageError


def _request(**options) -> ExportRequest:
    return ExportRequest("never_read.ckpt", Path("enc.onnx"), options={**onnx.OPTIONS, **options})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"atol": float("nan")}, r"--atol must be a finite difference >= 0 \(default 1e-4\), got nan"),
        ({"atol": -1.0}, "got -1.0"),
    ],
)
def test_check__values_that_cannot_make_a_file_are_refused(options, message):
    with pytest.raises(UsageError, match=message):
        onnx.TARGET.check(_request(**options))


def test_check__a_missing_package_of_the_extra_is_named(monkeypatch):
    pytest.importorskip("onnxscript", reason="the onnx extra: pip install -e '.[onnx]'")
    onnx.TARGET.check(_request(pool="avg", atol=0.0))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ConfigError, match=r'ONNX export needs the onnx extra: pip install -e "\.\[onnx\]"'):
        onnx.TARGET.check(_request())
