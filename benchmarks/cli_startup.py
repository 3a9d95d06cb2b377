"""How long the ``mae`` command takes to answer, in fresh interpreters: ``mae --help`` (the subcommand list,
the target: under 1 s), against the bare interpreter start-up measured in the same run (the
reference), and a subcommand's ``--help`` (which builds its parser, so it imports torch and the project).

    python benchmarks/cli_startup.py                    # 7 rounds, median seconds and ratios printed
    python benchmarks/cli_startup.py --rounds 3 --out benchmarks/results/cli_startup.json

Rounds interleave the cases, so a slow moment of the machine falls on all of them. Nothing is asserted:
the numbers go in docs/getting-started.md.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cases() -> dict[str, list[str]]:
    """Name -> command line. ``mae`` is the console script when it is on PATH, else ``python -m mae``
    (the same ``main``)."""
    script = shutil.which("mae")
    mae = [script] if script else [sys.executable, "-m", "mae"]
    return {
        "python -c pass (reference)": [sys.executable, "-c", "pass"],
        "mae --help": [*mae, "--help"],
        "mae version": [*mae, "version"],
        "mae export --help": [*mae, "export", "--help"],
    }


def time_once(command: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited with {result.returncode}: {result.stderr[-2000:]}")
    return seconds


def measure(rounds: int) -> dict:
    commands = cases()
    times = {name: [] for name in commands}
    for _ in range(rounds):
        for name, command in commands.items():
            times[name].append(time_once(command))
    reference = statistics.median(times["python -c pass (reference)"])
    rows = {
        name: {
            "median_s": round(statistics.median(t), 3),
            "min_s": round(min(t), 3),
            "vs_reference": round(statistics.median(t) / reference, 2),
        }
        for name, t in times.items()
    }
    return {"rounds": rounds, "command": " ".join(commands["mae --help"][:-1]), "rows": rows}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None, help="also write the results here (JSON)")
    args = parser.parse_args(argv)
    results = measure(args.rounds)
    print(f"{'case':<30}{'median s':>10}{'min s':>8}{'x python -c pass':>18}")
    for name, row in results["rows"].items():
        print(f"{name:<30}{row['median_s']:>10.3f}{row['min_s']:>8.3f}{row['vs_reference']:>18.2f}")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
