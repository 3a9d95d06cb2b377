"""A run's config files: reading one and checking it is a mapping of settings (``read_config``), the bases a
config that only changes another stacks on (its first line ``# stacks on: base.yaml``: ``config_stack``),
merging them as jsonargparse merges config files given one after another (``merge_configs``), and writing
a merged config as the recipes are written (``dump_config``)."""

import re
from pathlib import Path
from typing import Any

import yaml

from mae.errors import ConfigError

# First line of a config that only changes another one (``configs/pretrain/imagenet_vit_base_1gpu.yaml``).
STACKS_ON = re.compile(r"^# stacks on: (\S+\.yaml)")


def read_config(path: str | Path, given_as: str = "") -> dict[str, Any]:
    """The settings in the config file ``path``: a YAML mapping (``model:``, ``data:``, ``trainer:`` ...).
    ``given_as``: how the user gave it, for the message (default ``--config <path>``).

    Raises:
        ConfigError: naming the file and what is wrong: it cannot be read (a folder, no such file, no
            permission), is not text, is not valid YAML (with the line and column), is empty, or holds a
            list or a single value rather than a mapping.
    """
    label = given_as or f"--config {path}"
    if Path(path).is_dir():
        raise ConfigError(f"{label}: a folder, not a YAML file; give the YAML file of settings")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{label}: not a text file (UTF-8); give a YAML file of settings") from None
    except OSError as err:
        raise ConfigError(
            f"{label}: cannot be read ({err.strerror or err}); give a readable YAML file"
        ) from None
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        context, started = getattr(err, "context", None), getattr(err, "context_mark", None)
        if context and started is not None:  # e.g. a list opened with '[' lines before, never closed
            problem += f" ({context} started at line {started.line + 1}, column {started.column + 1})"
        raise ConfigError(f"{label}: not valid YAML: {where}{problem}") from None
    if config is None:
        raise ConfigError(f"{label}: empty: it sets nothing; give settings (such as 'trainer:' and its keys)")
    if not isinstance(config, dict):
        kind = "list" if isinstance(config, list) else "single value"
        raise ConfigError(
            f"{label}: a YAML {kind}, not a mapping of settings; give keys and their values, such as "
            "'trainer:' and its keys (mae recipes --show default prints an example)"
        )
    return config


def config_stack(path: str | Path) -> list[Path]:
    """The config files a run of the config file ``path`` reads, in order: the bases it stacks on (its first
    line ``# stacks on: base.yaml``, relative to the file, which may stack on another in turn), then ``path``.
    Each file is read and checked (``read_config``).

    Raises:
        ConfigError: a file of the stack cannot be used (naming the file that stacks on it), or the files
            stack in a loop.
    """
    stack = [Path(path)]
    read_config(path)
    while (match := STACKS_ON.match(stack[0].read_text(encoding="utf-8").split("\n", 1)[0])) is not None:
        base = stack[0].parent / match.group(1)
        if base.resolve() in {p.resolve() for p in stack}:
            names = " -> ".join(str(p) for p in [*reversed(stack), base])
            raise ConfigError(
                f"--config {path}: its configs stack in a loop ({names}); remove a '# stacks on:' line"
            )
        if not base.is_file() and not base.is_dir():
            raise ConfigError(
                f"--config {path}: {stack[0]} stacks on {base} (its first line), and there is no such file; "
                "correct that line or put the base there"
            )
        read_config(base, f"{base} (the base that {stack[0]} stacks on, from its first line)")
        stack.insert(0, base)
    return stack


def merge_configs(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, as jsonargparse merges the config files given one after another: mappings key
    by key, a class given with another ``class_path`` replacing the earlier class and its ``init_args``,
    anything else (a value, a list) replaced."""
    merged = dict(base)
    for key, value in top.items():
        earlier = merged.get(key)
        new_class = isinstance(value, dict) and "class_path" in value
        if isinstance(earlier, dict) and isinstance(value, dict):
            if new_class and value["class_path"] != earlier.get("class_path"):
                merged[key] = value
            else:
                merged[key] = merge_configs(earlier, value)
        else:
            merged[key] = value
    return merged


class _RecipeDumper(yaml.SafeDumper):
    """YAML as the recipes are written: mappings as indented blocks, lists on one line (``[0.8, 32]``)."""


_RecipeDumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)
)


def dump_config(config: dict[str, Any]) -> str:
    """``config`` as YAML, as the recipes are written (blocks for mappings, lists on one line)."""
    return yaml.dump(config, Dumper=_RecipeDumper, sort_keys=False, default_flow_style=False, width=100)
