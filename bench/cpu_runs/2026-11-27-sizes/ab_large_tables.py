"""Old (batch-2 only) CPU class vs the new one (large element-wise table, depthwise bands): plans and estimates."""
import os, sys, json, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from dataclasses import replace
from types import MappingProxyType
import bench as B
import models as M
import amp_rewrite
from amp_rewrite.plan import cost_model as cm
NEW = cm.DEVICE_COSTS["cpu-avx512-bf16"]
dense = dict(NEW.dense)
dense["DepthwiseConv2dNative"] = (cm.DenseBand(float("inf"), 3.5, 1.0),)
dense["DepthwiseConv2dNativeBackpropInput"] = (cm.DenseBand(float("inf"), 5.0, 2.45),)
dense["DepthwiseConv2dNativeBackpropFilter"] = (cm.DenseBand(float("inf"), 21.0, 2.5),)
OLD = replace(NEW, large_elementwise=MappingProxyType({}), large_elements=0, dense=MappingProxyType(dense))
M.set_batch(int(os.environ.get("B", "8")))
items = M.resolve_items(sys.argv[1].split(","))
res = {}
for name in items:
    item = M.corpus.build(name)
    gd, fetches = item.graph_def, list(item.fetches)
    vs = {ph: v.shape for ph, v in item.variables.items()}
    out = {}
    graphs = {"float32": gd}
    for label, cls in (("old", OLD), ("new", NEW)):
        cm.DEVICE_COSTS["cpu-avx512-bf16"] = cls
        from amp_rewrite.graph import shapes; shapes.clear_shape_memo()
        r = amp_rewrite.rewrite_graph_def(gd, target="auto", precision="bfloat16", fetches=fetches, use_env=False,
                                          lists="optimal", variable_shapes=vs, price_step=True)
        out[label] = B.plan_summary(r)
        graphs[label] = r.graph_def
    cm.DEVICE_COSTS["cpu-avx512-bf16"] = NEW
    same = graphs["old"].SerializeToString(deterministic=True) == graphs["new"].SerializeToString(deterministic=True)
    out["same_plan"] = same
    print(name, out, flush=True)
    if not same and os.environ.get("TIME", "1") == "1":
        graphs["float32_again"] = gd
        times, rounds = B.interleaved_step_times(graphs, item, repeats=int(os.environ.get("R", "9")),
                                                 iters=int(os.environ.get("I", "3")), sessions=3)
        f = times["float32"]
        out["measured"] = {k: v / f for k, v in times.items()}
        out["rounds"] = rounds
        print("  measured", {k: round(v, 3) for k, v in out["measured"].items()}, rounds, flush=True)
    res[name] = out
json.dump(res, open(os.environ.get("OUTF", "ab.json"), "w"), indent=1)
