"""New plan over old plan, per graph and batch, over several runs of ``ab_wide.py`` (each its
own process): every run's ratio and their median, and each run's A/A gap.  Only runs whose
plans are the adopted refit's count (``ab_b8.json``'s ResNet50 pair is byte-identical to it,
checked apart; its other plans are not).  Usage: ``python runs_summary.py b2:ab2_b2.json
b8:ab2_b8.json b8:ab_b8.json@resnet50/training ...`` (``@item``: only that item of the file)."""
import json
import os
import statistics
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))


def main(args: list[str]) -> None:
    runs = defaultdict(list)
    for arg in args:
        batch, rest = arg.split(":", 1)
        path, _, only = rest.partition("@")
        with open(os.path.join(HERE, path)) as f:
            for item, r in json.load(f).items():
                if "measured" in r and (not only or item == only):
                    m = r["measured"]
                    runs[(item, batch)].append((m["new"] / m["old"], abs(m["float32_again"] - 1), path))
    print(f"{'graph':24s} {'batch':5s} {'runs':>4s}  {'median new/old':>14s}  new/old per run (A/A)")
    for (item, batch), rs in sorted(runs.items()):
        per_run = ", ".join(f"{x:.3f} ({aa:.1%})" for x, aa, _ in rs)
        print(f"{item:24s} {batch:5s} {len(rs):4d}  {statistics.median(x for x, _, _ in rs):14.3f}  {per_run}")


if __name__ == "__main__":
    main(sys.argv[1:])
