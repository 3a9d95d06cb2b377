"""The ``mae`` command: one table of subcommands, ``mae --help`` without torch, recipes found by name inside
the package, one spelling per shared option (a test that fails on a second spelling), the spellings removed
in 0.3.0 refused with the one to use, shell completion from the same parsers, and the root ``train.py`` /
``finetune.py`` as ``mae pretrain`` / ``mae finetune``."""

import argparse
import json
import os
import subprocess
import sys

import pytest
from jsonargparse import ArgumentParser

from mae.cli.about import SHELLS, mae_parser, recipes_main
from mae.cli.command import parse_and_run
from mae.cli.command_options import (
    DEVICE_DEFAULT,
    REMOVED,
    SHARED_MARK,
    SHARED_OPTIONS,
    add_option,
    resolve_device,
)
from mae.cli.commands import BY_NAME, COMMANDS, DEBUG, TRAIN
from mae.cli.lightning import expand_stacked_configs, resolve_recipes
from mae.cli.main import main, usage
from mae.cli.recipes import RECIPES_DIR, RecipeNotFound, all_recipes, resolve_config
from mae.convert.sources import FORMATS
from tests.helpers import REPO, tiny_pretraining_checkpoint

# Spellings a command must not use for a shared option (the old ones, and the synonyms users guess).
FORBIDDEN = {
    *REMOVED,
    "--ckpt",
    "--weights",
    "--output",
    "--output-dir",
    "--num-workers",
    "--image-size",
    "--size",
    "--bs",
    "--cuda",
    "--gpu",
}
JSONARGPARSE_OWN = {"--print_config"}  # jsonargparse adds it to a parser with --config, spelt its way


def _normalised(flag: str) -> str:
    return flag.lstrip("-").replace("_", "-")


def spelling_problems(parsers: dict[str, ArgumentParser]) -> list[str]:
    """Every way ``parsers`` (command name -> parser) break the one-spelling rule."""
    problems, spellings = [], {}
    for command, parser in parsers.items():
        for action in parser._actions:
            shared = getattr(action, SHARED_MARK, None)
            if action.dest in SHARED_OPTIONS and shared is None:
                problems.append(
                    f"{command}: {action.option_strings or action.dest} is made by hand, not with "
                    f"add_option(parser, {action.dest!r})"
                )
            if shared is not None and tuple(action.option_strings) != SHARED_OPTIONS[shared].flags:
                problems.append(f"{command}: {action.option_strings} for the shared {shared}")
            for flag in action.option_strings:
                if (
                    flag in JSONARGPARSE_OWN or "." in flag
                ):  # dotted keys are jsonargparse's (--data.init_args.x)
                    continue
                if flag in FORBIDDEN:
                    problems.append(f"{command}: {flag} (a forbidden spelling)")
                if flag.startswith("--") and "_" in flag:
                    problems.append(f"{command}: {flag} has an underscore (hyphens only)")
                if not flag.startswith("--") and flag not in ("-h", "-k"):
                    problems.append(f"{command}: the short flag {flag}")
                spellings.setdefault(_normalised(flag), {}).setdefault(flag, []).append(command)
            if action.dest == "device" and action.default is not None:
                problems.append(f"{command}: --device defaults to {action.default}, not {DEVICE_DEFAULT}")
    for name, variants in spellings.items():
        if len(variants) > 1:
            problems.append(f"{name} is spelt {len(variants)} ways: {variants}")
    return problems


@pytest.fixture(scope="module")
def command_parsers() -> dict[str, ArgumentParser]:
    """Every non-Lightning command's parser, as its ``main`` builds it."""
    return {c.name: c.build_parser() for c in COMMANDS if c.group != TRAIN}


def test_one_spelling__every_command_spells_every_shared_option_the_same(command_parsers):
    assert not spelling_problems(command_parsers)
    users = {
        name: [c for c, p in command_parsers.items() if any(a.dest == name for a in p._actions)]
        for name in SHARED_OPTIONS
    }
    assert {n: len(c) for n, c in users.items()} == {
        "checkpoint": 8,
        "checkpoint_format": 8,
        "out": 7,
        "img_size": 4,
        "batch_size": 2,
        "workers": 2,
        "device": 5,
        "k": 2,
        "feature_blocks": 4,  # knn, probe, embed, anomaly
        "max_image_pixels": 7,
        "mean": 4,
        "std": 4,
    }
    for command in users["device"]:
        assert f"(default: {DEVICE_DEFAULT})" in " ".join(command_parsers[command].format_help().split()), (
            command
        )


def test_one_spelling__the_check_fails_on_a_second_spelling_a_hand_made_option_and_a_cpu_default():
    good = ArgumentParser(prog="mae good")
    add_option(good, "checkpoint_format", choices=FORMATS)
    add_option(good, "device")
    drifting = ArgumentParser(prog="mae drifting")
    drifting.add_argument("--format", default="auto")
    drifting.add_argument("--device", default="cpu")
    drifting.add_argument("--max_epochs", type=int)
    other = ArgumentParser(prog="mae other")
    other.add_argument("--max-epochs", type=int)
    problems = spelling_problems({"good": good, "drifting": drifting, "other": other})
    joined = "\n".join(problems)
    assert "drifting: --format (a forbidden spelling)" in joined
    assert "drifting: ['--device'] is made by hand" in joined and "--device defaults to cpu" in joined
    assert "drifting: --max_epochs has an underscore" in joined and "max-epochs is spelt 2 ways" in joined
    assert not any(p.startswith("good") for p in problems)
    with pytest.raises(
        ValueError, match="--device's default is cuda when available, else cpu in every command"
    ):
        add_option(ArgumentParser(), "device", default="cpu")


def test_flag_spelling__one_convention_per_family_of_commands(command_parsers):
    """The convention ``mae.cli.command_options`` writes down: the training commands' flags are their YAML
    keys, with underscores (``--trainer.max_epochs``, ``--ckpt_path``); every other command's have hyphens
    (``spelling_problems``), and ``replay`` is not among the training commands."""
    assert not [p for p in spelling_problems(command_parsers) if "underscore" in p]
    for command in (c for c in COMMANDS if c.group == TRAIN):
        flags = {
            flag
            for action in command.build_parser()._actions
            for flag in action.option_strings
            if flag.startswith("--") and " " not in flag  # not a link's "data.x --> model.x"
        }
        assert "--ckpt_path" in flags and "--trainer.max_epochs" in flags, command.name
        assert not [f for f in flags if "-" in f[2:]], command.name
    assert BY_NAME["replay"].group == DEBUG and BY_NAME["replay"].module == "mae.cli.replay"


def test_device__cuda_when_available_else_cpu(monkeypatch):
    import torch

    assert resolve_device("cuda:1") == "cuda:1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(None) == "cuda"
    parser = ArgumentParser(prog="mae x")
    add_option(parser, "device")
    assert parse_and_run(parser, lambda args: args.device, []) == "cuda"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_pretraining_checkpoint(tmp_path_factory.mktemp("mae_command"))


def test_removed_spellings__export_and_knn_stop_before_any_work_naming_the_new_spelling(
    checkpoint, tmp_path, capsys
):
    out = tmp_path / "encoder.safetensors"
    for argv, message in [
        (
            ["export", "--checkpoint", str(checkpoint), "--out", str(out), "--format", "lightning"],
            "--format was renamed --checkpoint-format (the old spelling was removed in 0.3.0)",
        ),
        (
            ["export", "--checkpoint", str(checkpoint), "--out", str(out), "--num_heads", "2"],
            "--num_heads was renamed --num-heads",
        ),
        (["knn", "--checkpoint", str(checkpoint), "--k", "3"], "--k was renamed -k"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not list(tmp_path.iterdir())
    main(["export", "--checkpoint", str(checkpoint), "--out", str(out), "--checkpoint-format", "lightning"])
    assert out.is_file() and out.with_suffix(".json").is_file()


def test_removed_positionals__export_and_shard_need_their_options(checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["export", str(checkpoint), str(tmp_path / "a.safetensors")])
    assert exit_.value.code == 2 and "unrecognized arguments: " in (capsys.readouterr().err)
    with pytest.raises(SystemExit) as exit_:
        main(["export", "--checkpoint", str(checkpoint)])
    assert exit_.value.code == 2 and "the following arguments are required: out" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["shard", str(tmp_path), str(tmp_path / "shards")])
    assert exit_.value.code == 2 and "--out" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_help__every_command_in_the_list_once_and_each_helps_as_mae_command(command_parsers, capsys):
    text = usage()
    for command in COMMANDS:
        assert sum(line.split()[:1] == [command.name] for line in text.splitlines()) == 1, command.name
    for name, parser in command_parsers.items():
        assert parser.format_help().startswith(f"usage: mae {name}"), name
        assert "python -m" not in parser.format_help(), name
    for name in ("pretrain", "finetune", "detect", "segment"):
        assert BY_NAME[name].build_parser().format_help().startswith(f"usage: mae {name}")
    with pytest.raises(SystemExit) as exit_:
        main(["export", "--help"])
    assert exit_.value.code == 0 and "--checkpoint-format" in capsys.readouterr().out


def test_unknown_command__exit_2_with_the_closest_name(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["pretrian", "--config", "default"])
    assert exit_.value.code == 2
    assert "unknown command 'pretrian'; did you mean 'pretrain'?" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2 and "pretrain" in capsys.readouterr().out


@pytest.mark.slow
def test_help__takes_no_heavy_import():
    code = (
        "import sys; from mae.cli.main import main; main(['--help']); "
        "heavy = [m for m in ('torch', 'lightning', 'timm', 'jsonargparse') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "pretrain" in result.stdout and "completion" in result.stdout


def test_recipes__every_recipe_has_its_one_line_and_mae_recipes_lists_them(capsys):
    recipes = all_recipes()
    assert len(recipes) == len(list(RECIPES_DIR.glob("*/*.yaml"))) >= 20
    assert all(r.summary for r in recipes), [r.name for r in recipes if not r.summary]
    assert (REPO / "configs").resolve() == RECIPES_DIR  # the repository's configs/ is the package's
    recipes_main([])
    listed = capsys.readouterr().out
    for recipe in recipes:
        assert recipe.name.split("/")[1] in listed and recipe.summary[:40] in " ".join(listed.split())


def test_recipes__by_name_folder_and_path_a_path_wins_nothing_outside_the_recipes(tmp_path, monkeypatch):
    assert resolve_config("default", ("pretrain",)) == str(RECIPES_DIR / "pretrain" / "default.yaml")
    assert resolve_config("default.yaml", ("pretrain",)) == str(RECIPES_DIR / "pretrain" / "default.yaml")
    assert resolve_config("default", ("finetune", "linprobe")) == str(
        RECIPES_DIR / "finetune" / "default.yaml"
    )
    assert resolve_config("linprobe/default", ("finetune", "linprobe")) == str(
        RECIPES_DIR / "linprobe/default.yaml"
    )
    monkeypatch.chdir(tmp_path)
    (tmp_path / "default").write_text("model: {}\n")
    assert resolve_config("default", ("pretrain",)) == "default"  # the user's file, not the recipe
    expected = (
        r"--config defualt: no such file, and no recipe of that name; did you mean default\? \(recipes of "
        r"this command: .*default_fast.*; mae recipes lists every recipe\)"
    )
    with pytest.raises(RecipeNotFound, match=expected):
        resolve_config("defualt", ("pretrain",))
    outside = tmp_path / "elsewhere" / "evil.yaml"
    outside.parent.mkdir()
    outside.write_text("model: {}\n")
    leaving = os.path.relpath(outside.with_suffix(""), RECIPES_DIR)  # a recipe "name" that leaves the recipes
    for escape in (leaving, "pretrain/../" + leaving):
        with pytest.raises(RecipeNotFound):
            resolve_config(escape, ("pretrain",))


def test_recipes__a_stacked_recipe_by_name_runs_on_its_base():
    argv = expand_stacked_configs(
        resolve_recipes(["--config", "imagenet_vit_base_1gpu", "--trainer.max_epochs", "1"], ("pretrain",))
    )
    base, stacked = (
        RECIPES_DIR / "pretrain" / "imagenet_vit_base.yaml",
        RECIPES_DIR / "pretrain/imagenet_vit_base_1gpu.yaml",
    )
    assert [a for a in argv if a.endswith(".yaml")] == [str(base), str(stacked)]
    both = expand_stacked_configs(
        resolve_recipes(["--config", "imagenet_vit_base", "--config=imagenet_vit_base_1gpu"], ("pretrain",))
    )
    assert both == ["--config", str(base), f"--config={stacked}"]


def test_class_list__the_shipped_list_is_found_from_any_folder(tmp_path, monkeypatch):
    from mae.data.sources.layout import select_classes

    monkeypatch.chdir(tmp_path)
    assert len(select_classes([], "configs/imagenet100_classes.txt")) == 100
    assert select_classes([], "imagenet100_classes.txt") == select_classes(
        [], "configs/imagenet100_classes.txt"
    )
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "imagenet100_classes.txt").write_text("n01\nn02\n")
    assert select_classes([], "configs/imagenet100_classes.txt") == ["n01", "n02"]  # the user's own file wins
    with pytest.raises(FileNotFoundError, match="class_list file mine.txt does not exist"):
        select_classes([], "mine.txt")


@pytest.mark.parametrize("shell", SHELLS)
def test_completion__a_script_from_the_same_parsers(shell):
    script = mae_parser(("knn", "export", "shard", "recipes")).get_completion_script(f"shtab-{shell}")
    for word in (
        "knn",
        "export",
        "shard",
        "recipes",
        "--checkpoint-format",
        "--max-image-pixels",
        "lightning",
    ):
        assert word in script, word
    assert "--checkpoint_format" not in script


def test_completion__the_mae_parser_holds_every_command():
    parser = mae_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(subcommands.choices) == [c.name for c in COMMANDS]


@pytest.mark.slow
def test_startup_benchmark__measures_the_list_against_a_bare_interpreter(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import cli_startup
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    out = tmp_path / "startup.json"
    results = cli_startup.main(["--rounds", "1", "--out", str(out)])
    rows = results["rows"]
    assert set(rows) == {"python -c pass (reference)", "mae --help", "mae version", "mae export --help"}
    assert rows["python -c pass (reference)"]["vs_reference"] == 1.0
    assert all(row["median_s"] > 0 for row in rows.values())  # the numbers go in README, not into asserts
    assert json.loads(out.read_text()) == results
