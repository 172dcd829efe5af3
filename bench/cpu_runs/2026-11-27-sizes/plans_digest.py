"""Plan summary (sha256 of the rewritten graph, converted nodes, Casts, estimated ratio) of items under the amp_rewrite checkout at $ROOT: run once with ROOT=<a worktree of 586d2ad> PYTHONPATH=<it> (with this checkout's bench/models.py and tests/corpus.py copied into it) and once with ROOT=<this checkout>; OUTD gets the graphs, B the batch, W the weights (trained by default)."""
import os, sys, json, hashlib
root = os.environ["ROOT"]
sys.path.insert(0, root); sys.path.insert(0, root + "/bench")
import amp_rewrite
assert amp_rewrite.__file__.startswith(root), amp_rewrite.__file__
import models as M
M.register(); M.set_batch(int(os.environ.get("B", "2"))); M.set_weights(os.environ.get("W", "trained"))
out = {}
for name in M.resolve_items(sys.argv[1].split(",")):
    item = M.corpus.build(name)
    vs = {ph: v.shape for ph, v in item.variables.items()}
    r = amp_rewrite.rewrite_graph_def(item.graph_def, target="auto", precision="bfloat16", fetches=list(item.fetches),
                                      use_env=False, lists="optimal", variable_shapes=vs, price_step=True)
    gd = r.graph_def.SerializeToString(deterministic=True)
    est = r.step_estimates
    out[name] = {"sha": hashlib.sha256(gd).hexdigest()[:12], "low": sum(1 for n in r.report["nodes"].values() if n.get("dtype") == "bfloat16"),
                 "casts": r.report["casts_to_low"] + r.report["casts_to_high"], "est": est.rewritten.total_ns / est.given.total_ns if est else None}
    open(os.environ["OUTD"] + "/" + name.replace("/", "_") + ".pb", "wb").write(gd)
    print(name, out[name], flush=True)
