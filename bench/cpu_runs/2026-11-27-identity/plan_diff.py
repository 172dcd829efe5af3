"""The nodes whose dtype differs between two ``plan_dump.py`` records, grouped by op, name
pattern (digits as ``N``) and the new reason: ``python plan_diff.py BEFORE.json AFTER.json``."""

from __future__ import annotations

import collections
import json
import re
import sys


def main(before_path: str, after_path: str) -> None:
    before, after = (json.load(open(p)) for p in (before_path, after_path))
    print(f"{after['workload']}: casts {before['casts_to_low']}+{before['casts_to_high']} -> "
          f"{after['casts_to_low']}+{after['casts_to_high']}")
    groups: collections.Counter = collections.Counter()
    for name, (op, dtype, reason) in after["nodes"].items():
        old = before["nodes"].get(name)
        if old is not None and old[1] != dtype:
            groups[(op, re.sub(r"\d+", "N", name), old[1], dtype, re.sub(r"\d+", "N", reason)[:110])] += 1
    for (op, pattern, old, new, reason), count in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{count:4d}  {op:12s} {pattern:64s} {old:>2} -> {new:<2} {reason}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
