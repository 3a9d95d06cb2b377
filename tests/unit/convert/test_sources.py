"""``read_checkpoint`` (``mae.convert.sources``): it walks the one table of formats in order, ``format=``
keeps the rows of that name, and a path no row recognises is refused naming every format tried and what each
looked for."""

import pytest
import torch

from mae.convert.sources import CHECKPOINT_FORMATS, FORMATS, read_checkpoint
from mae.errors import InputError


def test_formats__the_names_come_from_the_table_in_the_order_users_know():
    assert FORMATS == ("auto", "lightning", "official", "timm", "huggingface")
    assert {row.format for row in CHECKPOINT_FORMATS} == set(FORMATS) - {"auto"}


def test_refusal__names_every_format_tried_and_what_it_looked_for(tmp_path):
    torch.save({"weights": [1, 2], "note": "mine"}, tmp_path / "odd.pth")
    with pytest.raises(InputError) as refused:
        read_checkpoint(tmp_path / "odd.pth")
    message = str(refused.value)
    assert message.startswith(
        f"no checkpoint format recognises {tmp_path / 'odd.pth'}, which holds a dict of "
    )
    assert "top-level keys ['note', 'weights']" in message
    for row in CHECKPOINT_FORMATS:
        assert f"{row.name}: {row.looks_for}" in message
    with pytest.raises(InputError, match="which holds a folder of"):
        read_checkpoint(tmp_path)


def test_format__keeps_only_the_rows_of_that_name(tmp_path):
    torch.save({"model": {"cls_token": torch.zeros(1, 1, 4)}}, tmp_path / "official.pth")
    with pytest.raises(InputError) as refused:
        read_checkpoint(tmp_path / "official.pth", format="lightning")
    tried = [row.name for row in CHECKPOINT_FORMATS if row.name in str(refused.value)]
    assert tried == [row.name for row in CHECKPOINT_FORMATS if row.format == "lightning"]
    with pytest.raises(InputError, match="format 'onnx' is unknown"):
        read_checkpoint(tmp_path / "official.pth", format="onnx")
