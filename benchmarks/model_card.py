"""Record the default job's run for the model card shown on the encoder page, and write that card there.

``python benchmarks/model_card.py --checkpoint runs/pretrain_default/version_0/checkpoints/last.ckpt``
(after ``mae pretrain --config default``) stores what a card reads from the run (the checkpoint's facts as
``record.json``, the run folder's ``config.yaml`` and ``metrics.csv``) under
``benchmarks/results/default_card/`` and replaces the card between the page's ``CARD_BEGIN`` / ``CARD_END``
markers with the card ``mae export --to timm --out encoder_timm`` writes for that checkpoint.
``tests/unit/convert/test_model_card.py`` regenerates the card from the record and fails while the page
shows another.
"""

import argparse
import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "benchmarks" / "results" / "default_card"
PAGE = REPO / "docs" / "encoder.md"
CARD_BEGIN, CARD_END = "<!-- default-run card: begin -->", "<!-- default-run card: end -->"
SHOWN_CHECKPOINT = "runs/pretrain_default/version_0/checkpoints/last.ckpt"
FOLDER_NAME = "encoder_timm"
FACT_KEYS = ("format", "config", "data", "hparams", "epochs", "steps")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="the default job's last.ckpt, in its run folder")
    return parser


def recorded_card(record: Path = RECORD) -> str:
    """The card of the recorded run, as ``mae export --to timm --out encoder_timm`` writes it."""
    from mae.convert.exports import timm
    from mae.convert.model_card import RunFacts, attach_run_folder, model_card

    facts = RunFacts(SHOWN_CHECKPOINT, **json.loads((record / "record.json").read_text()))
    attach_run_folder(facts, record, Path(SHOWN_CHECKPOINT).parents[1])
    return model_card(facts, timm.CARD, FOLDER_NAME, has_decoder=False)


def page_card(page: Path = PAGE) -> str:
    """The card the page shows (inside a ```markdown block between the markers)."""
    text = page.read_text(encoding="utf-8")
    block = text[text.index(CARD_BEGIN) + len(CARD_BEGIN) : text.index(CARD_END)]
    return block.strip().removeprefix("````markdown\n").removesuffix("````").rstrip("\n") + "\n"


def main() -> None:
    from mae.convert.model_card import read_run
    from mae.convert.sources import read_checkpoint

    args = build_parser().parse_args()
    facts = read_run(read_checkpoint(args.checkpoint))
    if facts.run_folder is None:
        raise SystemExit(f"{args.checkpoint} is not in a run folder (<run>/checkpoints/, with config.yaml)")
    RECORD.mkdir(parents=True, exist_ok=True)
    facts.config["img_size"] = list(facts.config["img_size"])
    record = {key: getattr(facts, key) for key in FACT_KEYS}
    (RECORD / "record.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    for name in ("config.yaml", "metrics.csv"):
        shutil.copyfile(facts.run_folder / name, RECORD / name)
    text = PAGE.read_text(encoding="utf-8")
    start, end = text.index(CARD_BEGIN) + len(CARD_BEGIN), text.index(CARD_END)
    card = recorded_card()
    PAGE.write_text(f"{text[:start]}\n\n````markdown\n{card}````\n\n{text[end:]}", encoding="utf-8")
    print(card)


if __name__ == "__main__":
    main()
