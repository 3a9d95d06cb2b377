"""Which scorer a run uses (``mae.apps.anomaly.scorers.choice``), before anything is read: --method's with
its flags' settings, a flag of another scorer refused naming its scorer, a saved scorer's own settings with
the flags it fixes refused, and the table every choice reads."""

from dataclasses import fields
from pathlib import Path

import pytest
import torch

from mae.apps.anomaly.saved_scorer import save_scorer
from mae.apps.anomaly.scorers import DEFAULT_METHOD, SCORERS
from mae.apps.anomaly.scorers.base import ModelInputs, ScorerSettings
from mae.apps.anomaly.scorers.choice import choose_scorer, option_names, saved_scorer_choice
from mae.errors import InputError, UsageError


def nothing_given() -> dict:
    return dict.fromkeys(option_names())


def test_scorers__each_row_named_by_its_scorer_with_typed_settings_and_its_own_flags():
    assert {"mae", "pixel-knn", "features"} <= set(SCORERS) and DEFAULT_METHOD == "mae"
    for name, scorer in SCORERS.items():
        assert scorer.name == name and issubclass(scorer.Settings, ScorerSettings)
        assert scorer.Settings() == scorer.Settings.of(nothing_given())  # no flag: the defaults
        shared = {f.name for f in fields(ScorerSettings)}
        assert {o.name for o in scorer.options()} == {f.name for f in fields(scorer.Settings)} - shared
    flags = [o.flag for scorer in SCORERS.values() for o in scorer.options()]
    assert len(flags) == len(set(flags)) and "--coreset-fraction" in flags  # one scorer owns each flag


def test_choose_scorer__the_method_with_its_flags_and_another_scorers_flag_refused():
    choice = choose_scorer(None, {**nothing_given(), "mask_ratio": 0.5, "top_k": 2})
    assert choice.scorer is SCORERS["mae"] and choice.saved is None
    assert (choice.settings.mask_ratio, choice.settings.top_k, choice.settings.seed) == (0.5, 2, 0)
    assert choose_scorer("features", nothing_given()).settings.top_k == 1  # PatchCore's image score
    for method, flag, value, owner in (
        ("mae", "coreset_fraction", 0.5, "features"),
        ("features", "patch_size", 8, "pixel-knn"),
        ("pixel-knn", "raw_errors", True, "mae"),
    ):
        with pytest.raises(
            UsageError, match=f"--{flag.replace('_', '-')} is for --method {owner}; leave it out"
        ):
            choose_scorer(method, {**nothing_given(), flag: value})
    with pytest.raises(UsageError, match=r"--neighbourhood must be an odd number of patches .* got 2"):
        choose_scorer("features", {**nothing_given(), "neighbourhood": 2})


def test_check_fit__what_each_scorer_needs_named():
    inputs = ModelInputs()
    for method, message in (
        ("mae", "--method mae needs --checkpoint, an MAE with its decoder"),
        ("pixel-knn", "--method pixel-knn needs --normal: the defect-free images"),
        ("features", "--method features needs --checkpoint, the encoder whose patch tokens"),
    ):
        with pytest.raises(UsageError, match=message):
            choose_scorer(method, nothing_given()).check(inputs, normal=None)
    with pytest.raises(UsageError, match="--img-size 30 is not a multiple of the patch size 16"):
        choose_scorer("pixel-knn", nothing_given()).check(ModelInputs(img_size=30), normal=Path("normal"))


def test_saved_scorer_choice__its_own_settings_and_the_flags_it_fixes_refused(tmp_path):
    settings = {"patch_size": 8, "seed": 3, "top_k": 2}
    folder = save_scorer(
        tmp_path / "sc", {"reference": torch.zeros(1, 3, 8, 8)}, {"method": "pixel-knn", "settings": settings}
    )
    choice = saved_scorer_choice(folder, None, nothing_given(), {"--normal": None})
    assert choice.scorer is SCORERS["pixel-knn"] and choice.folder == folder
    assert (choice.settings.patch_size, choice.settings.seed, choice.settings.top_k) == (8, 3, 2)
    for options, message in (
        ({"seed": 1}, f"--seed is fixed by --scorer {folder} \\(3\\); leave it out"),
        ({"mask_ratio": 0.5}, "--mask-ratio is for --method mae"),
    ):
        with pytest.raises(UsageError, match=message):
            saved_scorer_choice(folder, None, {**nothing_given(), **options}, {})
    with pytest.raises(UsageError, match="is a scorer of --method pixel-knn, not mae"):
        saved_scorer_choice(folder, "mae", nothing_given(), {})
    with pytest.raises(UsageError, match="is fitted already: leave out --normal"):
        saved_scorer_choice(folder, None, nothing_given(), {"--normal": tmp_path})
    save_scorer(folder, {"x": torch.zeros(1)}, {"method": "padim", "settings": {}})
    with pytest.raises(InputError, match="a scorer of --method padim, which this mae does not have"):
        saved_scorer_choice(folder, None, nothing_given(), {})
