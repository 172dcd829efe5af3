"""The CPU class without the skinny-convolution bands (old) against with them (new): the optimal
bfloat16 plans of each item, their estimates, and, where the plans differ, float32, both plans
and float32 again timed interleaved (``bench.interleaved_step_times``, three sets of fresh
sessions).  ``NUMERICS=1``: also the median loss error of both plans over 16 batches;
``TIME=0``: no timing.  Usage: ``B=2 R=12 OUTF=ab.json python ab_skinny.py resnet50/training,...``."""
import json
import math
import os
import sys
from dataclasses import replace
from types import MappingProxyType

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")]
import bench as B  # noqa: E402
import models as M  # noqa: E402

from amp_rewrite.plan import cost_model as cm  # noqa: E402

NEW = cm.DEVICE_COSTS["cpu-avx512-bf16"]
dense = {op: tuple(b for b in bands if b.below_positions == math.inf) for op, bands in NEW.dense.items()}
OLD = replace(NEW, dense=MappingProxyType(dense))
assert OLD.dense != NEW.dense
M.register()
M.set_batch(int(os.environ.get("B", "2")))
M.set_weights(os.environ.get("W", "init"))
res = {}
for name in M.resolve_items(sys.argv[1].split(",")):
    item = M.corpus.build(name)
    out, graphs = {}, {"float32": item.graph_def}
    for label, cls in (("old", OLD), ("new", NEW)):
        cm.DEVICE_COSTS["cpu-avx512-bf16"] = cls
        r = B.optimal_bf16_for_this_cpu(item, price_step=True)
        out[label] = B.plan_summary(r)
        graphs[label] = r.graph_def
    cm.DEVICE_COSTS["cpu-avx512-bf16"] = NEW
    out["same_plan"] = (graphs["old"].SerializeToString(deterministic=True)
                        == graphs["new"].SerializeToString(deterministic=True))
    print(name, out, flush=True)
    if not out["same_plan"] and os.environ.get("NUMERICS") == "1":
        # The loss error (first output, as bench.py reads a training step's) against float32,
        # median over the same 16 batches bench.py uses.
        batches = B.input_batches(item, 16)
        ref = B.outputs(item.graph_def, item, batches)
        out["loss_rel_error"] = {k: B.median_error([B.rel_error(o[:1], r[:1]) for o, r in
                                                    zip(B.outputs(graphs[k], item, batches), ref)])
                                 for k in ("old", "new")}
        print("  loss error", out["loss_rel_error"], flush=True)
    if not out["same_plan"] and os.environ.get("TIME", "1") == "1":
        graphs["float32_again"] = item.graph_def
        times, rounds = B.interleaved_step_times(graphs, item, repeats=int(os.environ.get("R", "12")),
                                                 iters=int(os.environ.get("I", "3")), sessions=3)
        out["measured"] = {k: v / times["float32"] for k, v in times.items()}
        out["ms"] = {k: v * 1e3 for k, v in times.items()}
        out["rounds"] = rounds
        print("  measured", {k: round(v, 3) for k, v in out["measured"].items()}, rounds, flush=True)
    res[name] = out
json.dump(res, open(os.environ.get("OUTF", "ab_skinny.json"), "w"), indent=1)
