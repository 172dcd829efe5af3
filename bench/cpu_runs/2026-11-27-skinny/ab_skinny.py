"""The CPU class without the skinny-convolution bands (old) against with them (new): the optimal
bfloat16 plans of each item, their estimates, and, where the plans differ, float32, both plans
and float32 again timed interleaved (``bench.interleaved_step_times``, three sets of fresh
sessions).  ``NUMERICS=1``: also the median loss error of both plans over 16 batches;
``TIME=0``: no timing.  Usage: ``B=2 R=12 OUTF=ab.json python ab_skinny.py resnet50/training,...``.
Written against the class of 2026-11-27's skinny change (commit ae32d16); with a later class
it compares that class with and without its positions tiers."""
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
    out = B.ab_cost_classes(name, item, {"old": OLD, "new": NEW}, "cpu-avx512-bf16",
                            numerics=os.environ.get("NUMERICS") == "1", timing=os.environ.get("TIME", "1") == "1",
                            repeats=int(os.environ.get("R", "12")), iters=int(os.environ.get("I", "3")))
    if "rel_error" in out:
        out["loss_rel_error"] = out.pop("rel_error")  # the name its JSON files use
    res[name] = out
json.dump(res, open(os.environ.get("OUTF", "ab_skinny.json"), "w"), indent=1)
