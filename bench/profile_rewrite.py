"""Time (and optionally profile) ``rewrite_graph_def`` on corpus or synthetic graphs.

Usage::

    python bench/profile_rewrite.py resnet50/training                # 5 repeats, stage medians
    python bench/profile_rewrite.py resnet50/training -n 9 --tf      # also time TF's pass
    python bench/profile_rewrite.py synthetic:100000 -n 3            # bench/synthetic.py graph
    python bench/profile_rewrite.py resnet50/training --profile 30   # cProfile, top 30 by tottime
    python bench/profile_rewrite.py --sha resnet50/training bert_like/training  # output digests
    python bench/profile_rewrite.py --check bench/.cache/sha256.json  # compare with saved digests

Graphs: a corpus item name (``tests/corpus.py`` plus ``bench/models.py``) or
``synthetic:N``.  Corpus items take seconds to minutes to build, so their serialized GraphDef
and fetches are cached in ``bench/.cache/`` (git-ignored); delete that folder to rebuild.

The rewrite uses the benchmark's arguments for corpus graphs (``bench/bench.py``: target
``gpu:8.0``, float16, ``lists="tensorflow"``, the item's fetches, ``functions="reachable"``,
``use_env=False``) and the scaling benchmark's for synthetic ones (``target="gpu:8.0"``,
default lists).  ``--bugs`` adds ``tensorflow_bugs=True``.

``--sha`` prints one JSON object mapping ``graph`` to the sha256 of the exported GraphDef's
serialization (deterministic) and of the JSON report and plans; ``--save FILE`` writes it and
``--check FILE`` compares against it, so an optimisation can be checked for byte-identical
output.  Per-stage times come from ``RewriteResult.timings``; medians over ``-n`` repeats
(interleaved with TF's pass when ``--tf`` is given), as the machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import pstats
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
CACHE = os.path.join(HERE, ".cache")

import amp_rewrite  # noqa: E402

STAGES = ("lists", "import", "decide", "rewrite", "check", "export")


def load(name: str) -> tuple[Any, list[str] | None]:
    """The GraphDef and fetches of ``name`` (``None`` fetches for synthetic graphs)."""
    from tensorflow.core.framework import graph_pb2

    if name.startswith("synthetic:"):
        from synthetic import synthetic_graph

        return synthetic_graph(int(name.split(":", 1)[1]), seed=0), None
    path = os.path.join(CACHE, name.replace("/", "__") + ".pb")
    if not os.path.exists(path):
        from models import corpus, register

        register()
        item = corpus.build(name)
        os.makedirs(CACHE, exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            f.write(item.graph_def.SerializeToString(deterministic=True))
        with open(path + ".json", "w") as f:
            json.dump(list(item.fetches), f)
        os.replace(path + ".tmp", path)
    gd = graph_pb2.GraphDef()
    with open(path, "rb") as f:
        gd.ParseFromString(f.read())
    with open(path + ".json") as f:
        fetches = json.load(f)
    return gd, fetches


def kwargs(fetches: list[str] | None, bugs: bool) -> dict[str, Any]:
    if fetches is None:
        kw: dict[str, Any] = dict(target="gpu:8.0", use_env=False)
    else:
        kw = dict(target="gpu:8.0", precision="float16", lists="tensorflow", fetches=fetches,
                  functions="reachable", use_env=False)
    if bugs:
        kw["tensorflow_bugs"] = True
    return kw


def _canonical(obj: Any) -> Any:
    """A process-independent form of a plan: sets and plain dicts sorted (a node's attr dict
    follows protobuf map order, which varies between processes), other mappings such as
    ``NodeDecisions`` and dataclasses as item lists in their own order."""
    import dataclasses

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return (type(obj).__name__, [(f.name, _canonical(getattr(obj, f.name))) for f in dataclasses.fields(obj)])
    if type(obj) is dict:
        return sorted(((_canonical(k), _canonical(v)) for k, v in obj.items()), key=repr)
    if hasattr(obj, "items"):
        return [(_canonical(k), _canonical(v)) for k, v in obj.items()]
    if isinstance(obj, (set, frozenset)):
        return sorted((_canonical(x) for x in obj), key=repr)
    if isinstance(obj, (list, tuple)):
        return [_canonical(x) for x in obj]
    return obj


def digest(result: Any) -> dict[str, str]:
    """sha256 of the exported bytes, of the report and of the plans' repr."""
    out = result.graph_def.SerializeToString(deterministic=True)
    report = json.dumps(result.report, sort_keys=True, default=str).encode()
    plans = repr(_canonical(result.plans)).encode()
    return {
        "graph_def": hashlib.sha256(out).hexdigest(),
        "report": hashlib.sha256(report).hexdigest(),
        "plans": hashlib.sha256(plans).hexdigest(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("graphs", nargs="*")
    ap.add_argument("-n", type=int, default=5, help="repeats (default 5)")
    ap.add_argument("--tf", action="store_true", help="also time TensorFlow's pass (corpus graphs)")
    ap.add_argument("--bugs", action="store_true", help="tensorflow_bugs=True")
    ap.add_argument("--profile", type=int, metavar="K", help="cProfile one rewrite; print top K by tottime")
    ap.add_argument("--sha", action="store_true", help="print output digests")
    ap.add_argument("--save", metavar="FILE", help="write digests to FILE")
    ap.add_argument("--check", metavar="FILE", help="compare digests with FILE (graphs default to its keys)")
    args = ap.parse_args(argv)

    expected: dict[str, Any] = {}
    if args.check:
        with open(args.check) as f:
            expected = json.load(f)
        args.graphs = args.graphs or sorted(expected)
    digests: dict[str, Any] = {}
    failed = False
    for name in args.graphs:
        gd, fetches = load(name)
        kw = kwargs(fetches, args.bugs)
        amp_rewrite.rewrite_graph_def(gd, **kw)  # warm-up: list loading, imports
        if args.sha or args.save or args.check:
            keyed = {}
            for bugs in (False, True):
                r = amp_rewrite.rewrite_graph_def(gd, **kwargs(fetches, bugs))
                keyed["bugs" if bugs else "default"] = digest(r)
            digests[name] = keyed
            if args.check:
                ok = expected.get(name) == keyed
                failed |= not ok
                print(f"{name}: {'identical' if ok else 'DIFFERENT'}", flush=True)
            continue
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            r = amp_rewrite.rewrite_graph_def(gd, **kw)
            prof.disable()
            print(f"== {name}: {len(gd.node)} nodes; timings (ms) "
                  + " ".join(f"{k}={v * 1e3:.1f}" for k, v in r.timings.items()))
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
            continue
        tf_times: list[float] = []
        totals: list[float] = []
        stages: list[dict[str, float]] = []
        for _ in range(args.n):
            if args.tf and fetches is not None:
                from tf_oracle import tf_amp_rewrite

                t = time.perf_counter()
                tf_amp_rewrite(gd, fetches)
                tf_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            r = amp_rewrite.rewrite_graph_def(gd, **kw)
            totals.append(time.perf_counter() - t)
            stages.append(dict(r.timings))
        med = {k: statistics.median(s[k] for s in stages) * 1e3 for k in STAGES}
        line = (f"{name}: {len(gd.node)} nodes, n={args.n}: ours {statistics.median(totals) * 1e3:.1f} ms ("
                + ", ".join(f"{k} {v:.1f}" for k, v in med.items()) + ")")
        if tf_times:
            tf_ms = statistics.median(tf_times) * 1e3
            line += f"; TF {tf_ms:.1f} ms; ours/TF {statistics.median(totals) * 1e3 / tf_ms:.2f}"
        print(line, flush=True)
    if args.sha:
        print(json.dumps(digests, indent=1, sort_keys=True))
    if args.save:
        with open(args.save, "w") as f:
            json.dump(digests, f, indent=1, sort_keys=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
