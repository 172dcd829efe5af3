"""Digests of every corpus plan and rewritten graph, to prove a restructuring changed nothing.

For each corpus graph (:mod:`corpus`) under each configuration in :data:`CONFIGS` (every list
profile, planner and level, on GPU and CPU targets, float16 and bfloat16), the rewrite's
report (its JSON, keys sorted) and its rewritten GraphDef (serialized deterministically) are
hashed.  ``tests/golden/plan_digests.json`` holds the digests recorded before issue 25's
restructuring; ``tests/test_plans_unchanged.py`` recomputes them.

    python tests/plan_digests.py --write      # record the digests of the code as it is now
    python tests/plan_digests.py              # print which digests differ from the record
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# This checkout's package, not an installed copy: run as a script, Python would otherwise import
# whatever amp_rewrite site-packages holds, and compare digests of another version.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import amp_rewrite  # noqa: E402
import corpus  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "plan_digests.json")

#: name -> keyword arguments of ``amp_rewrite.rewrite_graph_def`` (besides graph and fetches).
CONFIGS: dict[str, dict] = {
    "default-gpu8.0-fp16": dict(lists="default", target="gpu:8.0", precision="float16"),
    "default-gpu7.0-fp16": dict(lists="default", target="gpu:7.0", precision="float16"),
    "default-gpu8.0-bf16": dict(lists="default", target="gpu:8.0", precision="bfloat16"),
    "default-cpu-bf16": dict(lists="default", target="cpu", precision="bfloat16"),
    "default-2gpus-fp16": dict(lists="default", target="gpu:8.0,6.1", precision="float16"),
    "default-infer-as-deny": dict(lists="default", target="gpu:8.0", precision="float16",
                                  level="TREAT_INFER_AS_DENY"),
    "default-force-all": dict(lists="default", target="gpu:8.0", precision="float16",
                              level="UNSAFE_FORCE_ALL"),
    "tensorflow-gpu8.0-fp16": dict(lists="tensorflow", target="gpu:8.0", precision="float16",
                                   functions="reachable"),
    "tensorflow-cpu-bf16": dict(lists="tensorflow", target="cpu", precision="bfloat16"),
    "optimal-gpu8.0-fp16": dict(lists="optimal", target="gpu:8.0", precision="float16"),
    "optimal-gpu7.0-fp16": dict(lists="optimal", target="gpu:7.0", precision="float16"),
    "optimal-cpu-bf16": dict(lists="optimal", target="cpu", precision="bfloat16"),
    "optimal-xla-gpu8.0-fp16": dict(lists="optimal", target="gpu:8.0", precision="float16",
                                    compiled=True),
    "min-casts-gpu8.0-fp16": dict(lists="default", planner="min-casts", target="gpu:8.0",
                                  precision="float16"),
}


def digest(name: str, config: str) -> str:
    """sha256 of the report and the rewritten graph of corpus item ``name`` under ``config``."""
    item = corpus.build(name)
    result = amp_rewrite.rewrite_graph_def(item.graph_def, fetches=list(item.fetches),
                                           use_env=False, **CONFIGS[config])
    h = hashlib.sha256()
    h.update(json.dumps(result.report, sort_keys=True, default=str).encode())
    h.update(b"\0")
    h.update(result.graph_def.SerializeToString(deterministic=True))
    return h.hexdigest()


def keys() -> list[tuple[str, str]]:
    return [(name, config) for name in corpus.corpus_names() for config in CONFIGS]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="record the digests")
    args = parser.parse_args()
    got = {f"{n}|{c}": digest(n, c) for n, c in keys()}
    if args.write:
        with open(GOLDEN, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {len(got)} digests to {GOLDEN}")
        return 0
    with open(GOLDEN) as f:
        want = json.load(f)
    bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    for k in bad:
        print("differs:", k)
    print(f"{len(got) - len(bad)} of {len(got)} unchanged")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
