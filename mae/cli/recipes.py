"""The recipes shipped with the package (``mae/configs/<folder>/<name>.yaml``; the repository's
``configs/`` is the same folder), how ``--config NAME`` finds one, and how any config file is read.

A recipe's file names its one-line purpose on a ``# recipe: ...`` line at its top, and a config that
only changes another names that one on its first line (``# stacks on: base.yaml``: ``config_stack``,
which ``mae.cli.lightning.expand_stacked_configs`` runs; ``shown_recipe`` merges the stack into one).
"""

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mae.errors import ConfigError

RECIPES_DIR = Path(__file__).resolve().parent.parent / "configs"
_SUMMARY = re.compile(r"^# recipe: (.+)$", re.MULTILINE)
# First line of a config that only changes another one (``configs/pretrain/imagenet_vit_base_1gpu.yaml``).
STACKS_ON = re.compile(r"^# stacks on: (\S+\.yaml)")


@dataclass(frozen=True)
class Recipe:
    """``name``: "<folder>/<stem>" (e.g. "pretrain/default"); ``path``: its YAML file."""

    name: str
    path: Path

    @property
    def summary(self) -> str:
        match = _SUMMARY.search(self.path.read_text(encoding="utf-8"))
        return match.group(1).strip() if match else ""

    @property
    def folder(self) -> str:
        return self.name.split("/")[0]


def all_recipes(folders: tuple[str, ...] | None = None) -> list[Recipe]:
    """Every recipe (or those in ``folders``), sorted by folder, then name."""
    found = [Recipe(f"{p.parent.name}/{p.stem}", p) for p in sorted(RECIPES_DIR.glob("*/*.yaml"))]
    return [r for r in found if folders is None or r.folder in folders]


class RecipeNotFound(ConfigError):
    """``--config`` named neither a file nor a recipe."""


def resolve_config(value: str, folders: tuple[str, ...]) -> str:
    """The file ``--config value`` means: ``value`` itself when it is a file (a path always wins), else
    the recipe it names: "default" is looked up in ``folders`` in order (a command's own recipes), and
    "<folder>/<name>" (e.g. "linprobe/default") in that folder; ".yaml" may be left out.

    Raises:
        RecipeNotFound: neither a file nor a recipe, naming the recipes ``folders`` hold.
    """
    if Path(value).is_file():
        return value
    name = value.removesuffix(".yaml")
    candidates = [RECIPES_DIR / f"{name}.yaml"] if "/" in name else []
    candidates += [RECIPES_DIR / folder / f"{name}.yaml" for folder in folders]
    for path in candidates:
        if path.is_file() and path.resolve().is_relative_to(RECIPES_DIR):
            return str(path)
    if Path(value).is_dir():
        raise ConfigError(
            f"--config {value}: a folder, not a YAML file; give the YAML file of settings (or the name of a "
            "recipe: mae recipes lists them)"
        )
    own = [r.name.split("/")[1] if r.folder == folders[0] else r.name for r in all_recipes(folders)]
    close = difflib.get_close_matches(name, own, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise RecipeNotFound(
        f"--config {value}: no such file, and no recipe of that name{hint} (recipes of this command: "
        f"{', '.join(own)}; mae recipes lists every recipe)"
    )


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


def recipe_name(path: Path) -> str:
    """The name of a shipped recipe's file, "<folder>/<stem>" (e.g. "pretrain/default"); else the path."""
    resolved = path.resolve()
    return (
        str(resolved.relative_to(RECIPES_DIR).with_suffix(""))
        if resolved.is_relative_to(RECIPES_DIR)
        else str(path)
    )


class _RecipeDumper(yaml.SafeDumper):
    """YAML as the recipes are written: mappings as indented blocks, lists on one line (``[0.8, 32]``)."""


_RecipeDumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)
)


def shown_recipe(path: Path) -> str:
    """What ``mae recipes --show`` prints of the recipe file ``path``: a comment naming the file, then the
    file; for a recipe that stacks on others, a config that runs on its own: the recipes it stacks on merged
    with it into one (``merge_configs``, its own values winning) under its comments and a line naming
    the recipes it was made from."""
    stack = config_stack(path)
    text = path.read_text(encoding="utf-8").rstrip("\n")
    if len(stack) == 1:
        return f"# {path}\n{text}"
    merged: dict[str, Any] = {}
    for file in stack:
        merged = merge_configs(merged, read_config(file))
    comments = []
    for line in text.splitlines()[1:]:  # its first line names the base, which is merged in
        if not line.startswith("#"):
            break
        comments.append(line)
    made_from = " + ".join(recipe_name(p) for p in stack)
    body = yaml.dump(merged, Dumper=_RecipeDumper, sort_keys=False, default_flow_style=False, width=100)
    return "\n".join(
        [
            f"# {path}",
            f"# made from the recipes {made_from}",
            "# (merged into one, later ones winning: it runs on its own)",
            *comments,
            body.rstrip("\n"),
        ]
    )
