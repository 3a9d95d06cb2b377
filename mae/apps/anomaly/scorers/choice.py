"""Which scorer a run of ``mae anomaly`` uses, from its flags and before any image is read or model loaded:
``--method``'s (default mae) with the settings its flags give, or a saved scorer's (``--scorer``) with its
own settings; a flag that would refit or change a saved scorer, or that belongs to another scorer, is refused
by name."""

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from mae.apps.anomaly.saved_scorer import SavedScorer, load_scorer
from mae.apps.anomaly.scorers import DEFAULT_METHOD, SCORERS
from mae.apps.anomaly.scorers.base import ModelInputs, Scorer, ScorerSettings, flag
from mae.errors import InputError, UsageError


@dataclass(frozen=True)
class ScorerChoice:
    """The ``scorer`` class and its ``settings``; a saved scorer's ``saved`` tensors and record and its
    ``folder`` when one is applied (None: the scorer is fitted by this run)."""

    scorer: type[Scorer]
    settings: ScorerSettings
    saved: SavedScorer | None = None
    folder: Path | None = None

    def check(self, inputs: ModelInputs, normal: Path | None) -> None:
        """The scorer's own checks of what it is fitted or applied with (``check_fit`` / ``check_apply``)."""
        if self.saved is None:
            self.scorer.check_fit(self.settings, inputs, normal)
        else:
            self.scorer.check_apply(inputs)


def option_names() -> list[str]:
    """Every settings field a flag sets, of every scorer: the keys ``choose_scorer``'s ``options`` holds."""
    return list(dict.fromkeys(f.name for scorer in SCORERS.values() for f in fields(scorer.Settings)))


def choose_scorer(method: str | None, options: dict[str, Any]) -> ScorerChoice:
    """``--method``'s scorer (None: the default) with the settings of ``options`` (each flag's value, None
    or False when not given; the others the scorer's defaults).

    Raises:
        UsageError: a flag of another scorer given; a setting out of its range (the scorer's ``Settings``).
    """
    scorer = SCORERS[method or DEFAULT_METHOD]
    _refuse_other_scorers_options(scorer, options)
    return ScorerChoice(scorer, scorer.Settings.of(options))


def saved_scorer_choice(
    folder: Path, method: str | None, options: dict[str, Any], refitting: dict[str, Any]
) -> ScorerChoice:
    """The scorer saved in ``folder`` (``--scorer``), with its own settings.

    Args:
        method: --method, when given: it must be the scorer's.
        options: as ``choose_scorer``'s; none of the scorer's settings may be given.
        refitting: flag -> value of the flags that would fit a new scorer (--normal, --save-scorer).

    Raises:
        UsageError: a flag in ``refitting`` given, another --method, a setting the scorer fixes or a flag of
            another scorer given.
        MissingFileError, InputError: no scorer there, or not a readable one (``load_scorer``).
    """
    for name, given in refitting.items():
        if given is not None:
            raise UsageError(
                f"--scorer {folder} is fitted already: leave out {name} (fit a new scorer without --scorer)"
            )
    saved = load_scorer(folder)
    recorded = saved.record["method"]
    if recorded not in SCORERS:
        raise InputError(
            f"--scorer {folder} is a scorer of --method {recorded}, which this mae does not have (it has "
            f"{', '.join(SCORERS)})"
        )
    if method not in (None, recorded):
        raise UsageError(f"--scorer {folder} is a scorer of --method {recorded}, not {method}")
    scorer = SCORERS[recorded]
    for field in fields(scorer.Settings):
        if options.get(field.name) not in (None, False):  # given (a switch: False unless given)
            raise UsageError(
                f"{flag(field.name)} is fixed by --scorer {folder} ({saved.record['settings'][field.name]}); "
                "leave it out"
            )
    _refuse_other_scorers_options(scorer, options)
    return ScorerChoice(scorer, scorer.Settings.of(saved.record["settings"]), saved, folder)


def _refuse_other_scorers_options(scorer: type[Scorer], options: dict[str, Any]) -> None:
    own = {f.name for f in fields(scorer.Settings)}
    for other in SCORERS.values():
        for option in other.options():
            if option.name not in own and options.get(option.name) not in (None, False):
                raise UsageError(
                    f"{option.flag} is for --method {other.name}; leave it out with --method {scorer.name}"
                )
