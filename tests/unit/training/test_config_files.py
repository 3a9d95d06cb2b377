"""A run's config files (``mae.training.config_files``): each read and checked, the bases a stacked one
names found in order, refused in a loop, and a merged config written as the recipes are."""

import pytest
import yaml

from mae.errors import ConfigError
from mae.training.config_files import config_stack, dump_config, read_config


def test_read_config__a_list_or_an_empty_file_is_refused_naming_the_file(tmp_path):
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ConfigError, match=r"list.yaml: a YAML list, not a mapping of settings"):
        read_config(tmp_path / "list.yaml")
    with pytest.raises(ConfigError, match=r"empty.yaml: empty: it sets nothing"):
        read_config(tmp_path / "empty.yaml")


def test_config_stack__bases_first_and_a_loop_is_refused(tmp_path):
    (tmp_path / "base.yaml").write_text("trainer:\n  max_epochs: 1\n")
    (tmp_path / "top.yaml").write_text("# stacks on: base.yaml\nmodel:\n  mask_ratio: 0.5\n")
    assert config_stack(tmp_path / "top.yaml") == [tmp_path / "base.yaml", tmp_path / "top.yaml"]
    (tmp_path / "a.yaml").write_text("# stacks on: b.yaml\nx: 1\n")
    (tmp_path / "b.yaml").write_text("# stacks on: a.yaml\nx: 2\n")
    with pytest.raises(ConfigError, match="stack in a loop"):
        config_stack(tmp_path / "a.yaml")


def test_dump_config__mappings_as_blocks_lists_on_one_line():
    text = dump_config({"data": {"crop": [0.2, 1.0]}, "seed": 0})
    assert text == "data:\n  crop: [0.2, 1.0]\nseed: 0\n" and yaml.safe_load(text)["data"]["crop"] == [
        0.2,
        1.0,
    ]
