"""Whole steps with the models' initial weights (zero biases), as first measured on 2026-11-27 (before sizes_check.py and models.trained_like existed): float32, TF bf16 and ours optimal, interleaved."""
import os, sys, json, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import bench as B
import models as M
import amp_rewrite
corpus = M.corpus
batch = int(os.environ.get("B", "8")); side = int(os.environ.get("SIDE", "224"))
names = sys.argv[1].split(",")
kind = os.environ.get("KIND", "inference")
corpus.BATCH = batch
M.register()
res = {}
for m in names:
    if m == "mobilenetv2":
        import keras, warnings
        def _mb(side=side):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return keras.applications.MobileNetV2(weights=None, input_shape=(side, side, 3), classes=10), (side, side, 3), False
        corpus.MODELS["mobilenetv2@x"] = (_mb, corpus.MODELS["mobilenetv2"][1])
        name = "mobilenetv2@x"
    elif m == "resnet50":
        import keras
        corpus.MODELS["resnet50@x"] = (lambda: (keras.applications.ResNet50(weights=None, input_shape=(side, side, 3), classes=10), (side, side, 3), False), corpus.MODELS["resnet50"][1])
        name = "resnet50@x"
    else:
        name = M.resized(m, side)
    item = corpus.build(f"{name}/{kind}")
    gd, fetches = item.graph_def, list(item.fetches)
    vs = {ph: v.shape for ph, v in item.variables.items()}
    t = time.perf_counter()
    tf_bf16 = B.tf_amp_rewrite(gd, fetches, mode="bf16")
    r = amp_rewrite.rewrite_graph_def(gd, target="auto", precision="bfloat16", fetches=fetches, use_env=False,
                                      lists="optimal", variable_shapes=vs, price_step=True)
    print(m, "rewrite s", time.perf_counter() - t, flush=True)
    pl = r.plans[""].placement
    est = {k: amp_rewrite.estimate_step_time(g, target="auto", precision="bfloat16", variable_shapes=vs).total_ns / 1e6
           for k, g in (("float32", gd), ("tf", tf_bf16), ("optimal", r.graph_def))}
    conv = sum(1 for n in r.graph_def.node if n.op == "Cast")
    graphs = {"float32": gd, "float32_again": gd, "tf_bf16": tf_bf16, "optimal": r.graph_def}
    times, rounds = B.interleaved_step_times(graphs, item, repeats=int(os.environ.get("R", "9")), iters=int(os.environ.get("I", "5")), sessions=3)
    out = {"measured_ms": {k: v * 1e3 for k, v in times.items()}, "est_ms": est, "casts_optimal": conv, "rounds": rounds,
           "placement": pl.as_dict() if pl is not None else None}
    res[f"{m}@{side}b{batch}/{kind}"] = out
    f = times["float32"]
    print(m, {k: round(v / f, 3) for k, v in times.items()}, "est", {k: round(v / est['float32'], 3) for k, v in est.items()}, flush=True)
json.dump(res, open(os.environ.get("OUTF", "out.json"), "w"), indent=1, default=str)
