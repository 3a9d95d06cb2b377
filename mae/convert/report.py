"""Loading a state dict into a module with every difference explained, never silently."""

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from mae.errors import InputError


@dataclass
class LoadReport:
    """What a load did: tensors loaded, model tensors left as initialised, checkpoint tensors ignored."""

    source: str
    format: str
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)  # the architecture that was loaded

    def __str__(self) -> str:
        lines = [f"loaded {len(self.loaded)} tensors from {self.source} ({self.format} format)"]
        if self.missing:
            lines.append(f"  not in the checkpoint (left as initialised): {_summarise(self.missing)}")
        if self.ignored:
            lines.append(f"  in the checkpoint but not used: {_summarise(self.ignored)}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def _summarise(keys: list[str]) -> str:
    """Collapse per-block keys: ``decoder_blocks.0-7.* (96 tensors)``; a CNN's decoder (every key under
    ``decoder.``) as ``decoder.* (N tensors)``."""
    groups: dict[str, list[str]] = {}
    for key in keys:
        m = re.match(r"^(decoder)\.|^(.*?blocks)\.(\d+)\.", key)
        groups.setdefault(f"{m.group(1) or m.group(2)}.*" if m else key, []).append(key)
    return ", ".join(k if len(v) == 1 and k == v[0] else f"{k} ({len(v)} tensors)" for k, v in groups.items())


def _matches(key: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


def block_count(keys: Iterable[str], prefix: str) -> int:
    """Number of ``<prefix>.<i>.`` blocks among ``keys`` (one more than the highest index)."""
    indices = [int(m.group(1)) for k in keys if (m := re.match(rf"^{prefix}\.(\d+)\.", k))]
    return max(indices) + 1 if indices else 0


def _likely_cause(key: str) -> str:
    if key.startswith("patch_embed"):
        return "a different patch size or number of input channels"
    if key in ("pos_embed", "decoder_pos_embed"):
        return "a different image size / patch grid"
    if key.startswith("head"):
        return "a different number of classes"
    if key.startswith("decoder") or key == "mask_token":
        return "a different decoder width"
    return "a different width (embed_dim) or MLP ratio, i.e. another model size"


def load_checked(
    module: nn.Module,
    state_dict: dict[str, torch.Tensor],
    report: LoadReport,
    allowed_missing: Iterable[str] = (),
    allowed_ignored: Iterable[str] = (),
) -> LoadReport:
    """Copy ``state_dict`` into ``module``; refuse anything that would be silently wrong.

    Args:
        allowed_missing: glob patterns of module tensors that may stay as initialised (a new head).
        allowed_ignored: glob patterns of checkpoint tensors that may go unused (a decoder).

    Raises:
        ValueError: a shape mismatch (naming the key, both shapes and the likely cause), or missing /
            unused tensors outside the allowed patterns (naming them, and depths when they differ).
    """
    own = module.state_dict()
    problems = state_dict_mismatch(own, state_dict, allowed_missing, allowed_ignored)
    if problems:
        raise InputError(f"{report.source} does not fit the model: " + "; ".join(problems))
    missing = sorted(k for k in own if k not in state_dict)
    ignored = sorted(k for k in state_dict if k not in own)
    module.load_state_dict({k: v for k, v in state_dict.items() if k in own}, strict=False)
    report.loaded = sorted(k for k in state_dict if k in own)
    report.missing, report.ignored = missing, ignored
    return report


def state_dict_mismatch(
    own: dict[str, torch.Tensor],
    given: dict[str, torch.Tensor],
    allowed_missing: Iterable[str] = (),
    allowed_ignored: Iterable[str] = (),
) -> list[str]:
    """Why ``given`` does not fit a module whose state dict is ``own``; empty when it fits.

    Lists shape differences (key, both shapes, the likely cause), differing block counts, and
    tensors missing from ``given`` or not in the module, outside the allowed glob patterns.
    """
    problems = [
        f"{key} has shape {tuple(given[key].shape)} in the checkpoint but {tuple(own[key].shape)} in the "
        f"model: {_likely_cause(key)}"
        for key in sorted(set(own) & set(given))
        if own[key].shape != given[key].shape
    ]
    bad_missing = [k for k in sorted(own) if k not in given and not _matches(k, allowed_missing)]
    bad_ignored = [k for k in sorted(given) if k not in own and not _matches(k, allowed_ignored)]
    if bad_missing or bad_ignored:
        for prefix in ("blocks", "decoder_blocks"):
            have, want = block_count(given, prefix), block_count(own, prefix)
            if have != want:
                problems.append(
                    f"the checkpoint has {have} {prefix} but the model {want} (a different depth)"
                )
        if bad_missing:
            problems.append(f"missing from the checkpoint: {_summarise(bad_missing)}")
        if bad_ignored:
            problems.append(f"not in the model: {_summarise(bad_ignored)}")
    return problems
