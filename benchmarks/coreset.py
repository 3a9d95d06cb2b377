"""How long the feature memory's greedy coreset (``mae.apps.anomaly.features.coreset``) takes against the
number of patch vectors M, and how well its picks cover them against the plain greedy.

For each data set and M in ``--sizes``, k = ``--fraction`` x M picks, as ``coreset`` makes them: the seeded
Gaussian projection of the (M, D) vectors to ``PROJECTION_DIM`` dimensions (timed alone), then
``greedy_k_center`` on the projection (timed: the selection, the rounds of batched distance updates), k + 1
picks -- the greedy's first k picks are the same, and the last one's distance to them is the coverage
radius of the first k (the largest distance of a point to its nearest pick), read without another
O(k M D) pass. The plain greedy (the loop ``greedy_k_center`` replaced: one pass over all the points per
pick, float32, direct differences) runs on the same projection from the same start where M <=
``--plain-max``; above, ``--plain-picks`` of its picks are timed and its time is extrapolated to k + 1
picks (each pick costs the same O(M D) pass). Where M <= ``--exact-max`` the radii are also recomputed
directly (``nearest_distances``), in the projection and in the original D dimensions, and in the original
dimensions for a random subset of k vectors too (what the greedy buys over a uniform subsample).

Data (``--data``):

- ``gaussian``: standard normal vectors, D = 384 (the hard case for k-center: no structure to exploit);
- ``digits``: patch features of scikit-learn's digits (and their transposed and mirrored copies, 7,188
  images), upsampled to 64 px, through a randomly initialised timm ViT (patch 4, width 192, depth 4,
  seeded): blocks 1 and 3 concatenated (D = 384), each averaged over its 3 x 3 neighbours
  (``patch_features``, the feature memory's own), 256 per image, the first M of the images in a seeded
  order.

Before the sizes, ``--candidates-at`` M of each data set is run once per value of ``--candidates`` (the
points each round of the greedy considers) to choose ``CANDIDATES``. The 1-minute load average
(``os.getloadavg``) is recorded before and after every case; a case at M = ``--rerun-at`` that ran with
more load than threads is measured again at the end (both kept). Writes ``results.json`` (after each
case: an interrupted run keeps the cases done, and ``--resume`` keeps them and measures the rest) and
``results.md`` to ``--out``.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/coreset.py      # the published run: about 1.5 h on 2 cores
    python benchmarks/coreset.py --quick --out /tmp/coreset   # the script end to end in seconds
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from harness import claim_out, machine, write_results
from torch.nn import functional as F

import mae.apps.anomaly.features as features
from mae.apps.anomaly.features import PROJECTION_DIM, greedy_k_center, nearest_distances, patch_features
from mae.io.atomic import atomic_write

WRITTEN_BY = "benchmarks/coreset.py"
RESULTS = "results.json"  # the out folder's record: what this script wrote there
OUTPUTS = (RESULTS, "results.md")
FEATURE_DIM = 384  # two concatenated blocks of a ViT of width 192
VIT = dict(img_size=64, patch_size=4, embed_dim=192, depth=4, num_heads=3, num_classes=0)
VIT_BLOCKS = [1, 3]
IMAGE_BATCH = 64


def plain_greedy_k_center(points: torch.Tensor, k: int, start: int) -> torch.Tensor:
    """(k,) picks of the plain greedy k-center, one pass over all (M, D) ``points`` per pick (float32,
    direct differences): the loop ``greedy_k_center`` replaced, as it was."""
    picks = torch.empty(k, dtype=torch.long, device=points.device)
    pick = torch.tensor([start], device=points.device)
    nearest = torch.full((len(points),), float("inf"), device=points.device)
    for i in range(k):
        picks[i] = pick[0]
        nearest = torch.minimum(
            nearest, torch.linalg.vector_norm(points - points.index_select(0, pick), dim=1)
        )
        pick = nearest.argmax().view(1)
    return picks


def gaussian_vectors(count: int, seed: int) -> torch.Tensor:
    """(count, FEATURE_DIM) standard normal vectors drawn from ``seed``."""
    return torch.randn(count, FEATURE_DIM, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def digit_vectors(count: int, seed: int) -> torch.Tensor:
    """(count, FEATURE_DIM) patch features of the digits (see the module's docstring): the first
    ceil(count / 256) images of the 4 x 1,797 in the order drawn from ``seed``, their 256 patch vectors
    each, row-major, cut to ``count``."""
    from sklearn.datasets import load_digits
    from timm.models.vision_transformer import VisionTransformer

    digits = torch.tensor(load_digits().images, dtype=torch.float32) / 16  # (1797, 8, 8) in [0, 1]
    images = torch.cat([digits, digits.transpose(1, 2), digits.flip(2), digits.transpose(1, 2).flip(1)])
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    per_image = (VIT["img_size"] // VIT["patch_size"]) ** 2
    chosen = images[order[: -(-count // per_image)]]
    if len(chosen) * per_image < count:
        raise ValueError(f"the digits give {len(images) * per_image} vectors, not {count}")
    torch.manual_seed(seed)
    encoder = VisionTransformer(**VIT).eval()
    out = []
    for b in range(0, len(chosen), IMAGE_BATCH):
        imgs = F.interpolate(chosen[b : b + IMAGE_BATCH, None], size=VIT["img_size"], mode="bilinear")
        imgs = ((imgs - 0.5) / 0.5).expand(-1, 3, -1, -1)
        out.append(patch_features(encoder, imgs, VIT_BLOCKS).flatten(0, 1))
    return torch.cat(out)[:count]


DATA = {"gaussian": gaussian_vectors, "digits": digit_vectors}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, function, *args):
    """(result, wall seconds, process CPU seconds) of ``function(*args)``."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    result = function(*args)
    sync(device)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def last_pick_distance(points: torch.Tensor, picks: torch.Tensor) -> float:
    """The distance of the last of ``picks`` to its nearest other pick (float64, direct): the coverage
    radius of the others when the picks are a greedy k-center's."""
    others = points[picks[:-1]].double()
    return float(torch.linalg.vector_norm(others - points[picks[-1]].double(), dim=1).min())


def project(vectors: torch.Tensor, seed: int) -> tuple[torch.Tensor, int]:
    """``coreset``'s projection of (M, D) ``vectors`` to ``PROJECTION_DIM`` dimensions and its start index,
    drawn from ``seed`` as it draws them."""
    generator = torch.Generator().manual_seed(seed)
    projection = torch.randn(vectors.shape[1], PROJECTION_DIM, generator=generator).to(vectors.device)
    points = vectors.float() @ projection
    start = int(torch.randint(len(vectors), (1,), generator=generator))
    return points, start


def load() -> float:
    return round(os.getloadavg()[0], 2)


def measure(
    args, name: str, vectors: torch.Tensor, candidates: int = features.CANDIDATES, full: bool = True
) -> dict:
    """One case: ``vectors``' projection, selection and radius, and where ``full`` the plain greedy's and
    the radii recomputed (see the module's docstring)."""
    device = vectors.device
    count = len(vectors)
    k = max(1, round(args.fraction * count))
    row = {"data": name, "M": count, "D": vectors.shape[1], "k": k, "candidates": candidates}
    row["load_before"] = load()
    (points, start), row["projection_s"], _ = timed(device, project, vectors, args.seed)
    picks, row["selection_s"], row["selection_cpu_s"] = timed(
        device, greedy_k_center, points, min(k + 1, count), start, candidates
    )
    row["total_s"] = row["projection_s"] + row["selection_s"]
    row["load_after"] = load()
    row["radius"] = last_pick_distance(points, picks) if k < count else 0.0
    if not full:
        return row
    if count <= args.plain_max:
        plain, row["plain_s"], _ = timed(device, plain_greedy_k_center, points, min(k + 1, count), start)
        row["plain_extrapolated"] = False
        row["plain_radius"] = last_pick_distance(points, plain) if k < count else 0.0
        row["radius_ratio"] = row["radius"] / row["plain_radius"] if row["plain_radius"] else 1.0
        row["same_picks"] = len(set(picks[:k].tolist()) & set(plain[:k].tolist())) / k
    else:
        few = min(args.plain_picks, k + 1)
        _, seconds, _ = timed(device, plain_greedy_k_center, points, few, start)
        row["plain_s"] = seconds * (k + 1) / few
        row["plain_extrapolated"] = True
        plain = None
    row["speedup"] = row["plain_s"] / row["selection_s"]
    if count <= args.exact_max:
        bank = picks[:k]
        row["radius_exact"] = float(nearest_distances(points, points[bank]).max())
        row["radius_original"] = float(nearest_distances(vectors, vectors[bank]).max())
        if plain is not None:
            row["plain_radius_original"] = float(nearest_distances(vectors, vectors[plain[:k]]).max())
        subset = torch.randperm(count, generator=torch.Generator().manual_seed(args.seed))[:k].to(device)
        row["random_radius_original"] = float(nearest_distances(vectors, vectors[subset]).max())
    return row


def table(results: dict) -> str:
    """The results as markdown: the curve, then the choice of ``CANDIDATES``."""
    meta = results["meta"]
    lines = [
        "| vectors (data, M) | k | projection s | selection s | selection CPU s | plain greedy s | "
        "speed-up | radius (projection) | ratio to plain (projection) | radius (original D) | "
        "ratio to plain (original D) | random subset's | load before / after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(row, key, digits=3):
        return "-" if row.get(key) is None else f"{row[key]:.{digits}f}"

    for row in results["cases"]:
        plain = "-" if "plain_s" not in row else f"{row['plain_s']:.1f}"
        plain += " (extrapolated)" if row.get("plain_extrapolated") else ""
        speedup = f"{row['speedup']:.1f}x" if "speedup" in row else "-"
        ratio_original = (
            f"{row['radius_original'] / row['plain_radius_original']:.4f}"
            if row.get("plain_radius_original")
            else "-"
        )
        lines.append(
            f"| {row['data']}, {row['M']:,}{', rerun' if row.get('rerun') else ''} | {row['k']:,} | "
            f"{row['projection_s']:.2f} | {row['selection_s']:.2f} | {row['selection_cpu_s']:.1f} | "
            f"{plain} | {speedup} | {row['radius']:.3f} | {cell(row, 'radius_ratio', 4)} | "
            f"{cell(row, 'radius_original')} | {ratio_original} | {cell(row, 'random_radius_original')} | "
            f"{row['load_before']} / {row['load_after']} |"
        )
    lines += [
        "",
        f"{meta['machine']}, {meta['threads']} threads, device {meta['device']}, fraction {meta['fraction']} "
        f"(k = fraction x M), seed {meta['seed']}, {meta['candidates']} candidates a round. Seconds are wall "
        "time (CPU s: the process's, all threads); selection = greedy_k_center on the projection to "
        f"{PROJECTION_DIM} dimensions, k + 1 picks; projection = the seeded Gaussian matrix product from "
        f"D = {FEATURE_DIM}. Plain greedy: one pass over all points per pick, run to the end where M <= "
        f"{meta['plain_max']:,}, else {meta['plain_picks']} picks timed and extrapolated (a rerun: the "
        "selection alone). Radius: the largest distance of a vector to its nearest pick, read from pick "
        "k + 1 in the projection; in the original D and for a random subset of k vectors recomputed "
        f"directly where M <= {meta['exact_max']:,}. "
        "Load: the 1-minute load average before and after the selection.",
    ]
    sweep = results["candidates_sweep"]
    if sweep:
        lines += [
            "",
            "| candidates a round (data, M) | k | selection s | selection CPU s | radius | "
            "load before / after |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['candidates']}, {r['data']}, {r['M']:,} | {r['k']:,} | {r['selection_s']:.2f} | "
            f"{r['selection_cpu_s']:.1f} | {r['radius']:.3f} | {r['load_before']} / {r['load_after']} |"
            for r in sweep
        ]
    return "\n".join(lines)


def size(text: str) -> int:
    """A count given as ``2e5`` or ``200000``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a count, e.g. 2e5") from None
    if value < 2 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole count of at least 2")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    """The script's options (what ``parse`` reads, before its own checks)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--sizes", type=size, nargs="+", default=[10**4, 3 * 10**4, 10**5, 2 * 10**5, 5 * 10**5, 10**6]
    )
    p.add_argument("--data", nargs="+", choices=sorted(DATA), default=["gaussian", "digits"])
    p.add_argument("--fraction", type=float, default=0.1, help="k / M (default 0.1, mae anomaly's default)")
    p.add_argument("--plain-max", type=size, default=2 * 10**5, help="the plain greedy runs to the end up to")
    p.add_argument("--plain-picks", type=int, default=300, help="plain picks timed above --plain-max")
    p.add_argument("--exact-max", type=size, default=10**5, help="radii recomputed directly up to this M")
    p.add_argument("--candidates", type=int, nargs="*", default=[256, 512, 1024, 2048])
    p.add_argument("--candidates-at", type=size, default=10**5, help="the M of the candidates sweep")
    p.add_argument("--rerun-at", type=size, default=2 * 10**5, help="the M measured again if loaded")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/coreset"))
    p.add_argument("--resume", action="store_true", help="keep the --out results' cases, measure the rest")
    p.add_argument("--quick", action="store_true", help="small sizes: the script end to end in seconds")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if not 0 < args.fraction < 1:
        p.error(f"--fraction must be strictly between 0 and 1, got {args.fraction}")
    if args.quick:
        args.sizes, args.plain_max, args.exact_max, args.plain_picks = [2000, 5000], 2000, 5000, 20
        args.candidates, args.candidates_at, args.rerun_at = [64, 1024], 2000, 5000
    return args


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)
    claim_out(args.out, WRITTEN_BY, OUTPUTS, RESULTS)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    meta = {
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "fraction": args.fraction,
        "seed": args.seed,
        "candidates": features.CANDIDATES,
        "update_block": features.UPDATE_BLOCK,
        "projection_dim": PROJECTION_DIM,
        "plain_max": args.plain_max,
        "plain_picks": args.plain_picks,
        "exact_max": args.exact_max,
        "sizes": args.sizes,
        "data": {
            "gaussian": f"standard normal, D = {FEATURE_DIM}",
            "digits": "patch features of the digits (x4: transposed, mirrored) at 64 px, random-init timm "
            f"ViT {VIT}, blocks {VIT_BLOCKS} concatenated, 3 x 3 neighbourhood mean",
        },
    }
    results = {
        "written_by": WRITTEN_BY,
        "files": list(OUTPUTS),
        "meta": meta,
        "candidates_sweep": [],
        "cases": [],
    }
    if args.resume and (args.out / RESULTS).is_file():  # claim_out checked that this script wrote it
        before = json.loads((args.out / RESULTS).read_text())
        results["candidates_sweep"], results["cases"] = before["candidates_sweep"], before["cases"]
    swept = {(r["data"], r["candidates"]) for r in results["candidates_sweep"]}
    done = {(r["data"], r["M"]) for r in results["cases"]}

    def save() -> None:
        write_results(args.out / RESULTS, results)
        text = table(results) + "\n"
        atomic_write(args.out / "results.md", lambda tmp: tmp.write_text(text))

    for name in args.data:
        if all((name, c) in swept for c in args.candidates) and all((name, m) in done for m in args.sizes):
            continue
        every = DATA[name](max(args.sizes + [args.candidates_at]), args.seed).to(device)
        for candidates in [c for c in args.candidates if (name, c) not in swept]:
            row = measure(args, name, every[: args.candidates_at], candidates, full=False)
            results["candidates_sweep"].append(row)
            print(f"{name} M={row['M']} candidates {candidates}: {row['selection_s']:.2f} s", file=sys.stderr)
            save()
        for count in [m for m in args.sizes if (name, m) not in done]:
            row = measure(args, name, every[:count])
            results["cases"].append(row)
            print(
                f"{name} M={count}: projection {row['projection_s']:.2f} s, selection "
                f"{row['selection_s']:.2f} s, plain {row['plain_s']:.1f} s, load {row['load_before']}/"
                f"{row['load_after']}",
                file=sys.stderr,
            )
            save()
        del every
    reran = {r["data"] for r in results["cases"] if r.get("rerun")}
    for row in list(results["cases"]):
        loaded = max(row["load_before"], row["load_after"]) > args.threads
        if row["M"] == args.rerun_at and loaded and row["data"] not in reran:
            vectors = DATA[row["data"]](row["M"], args.seed).to(device)
            rerun = measure(args, row["data"], vectors, full=False)
            results["cases"].append({**rerun, "rerun": True})
            save()
    print(table(results))
    print(f"\nwrote {args.out}: {', '.join(OUTPUTS)}", file=sys.stderr)
    return table(results)


if __name__ == "__main__":
    main()
