"""How much does rounding one tensor move a graph's output?  A yardstick for numerics gaps.

Usage::

    python bench/perturb.py --graph inceptionv3/training --tensor inception_v3_1/conv2d_2_1/convolution
    python bench/perturb.py --graph resnet50/training --precision bfloat16 --tensor NODE --tensor NODE2
    python bench/perturb.py --graph inceptionv3/training --image-side 150   # the rewrites only, 150x150

A batch-2 training step is chaotic: a batch normalization over two values per channel maps
them to about +-1 whatever their difference, so a perturbation can flip a sign and the loss
moves far more than the perturbation.  When a rewrite's error is above TensorFlow's on such a
graph, the question is whether the rewrite does something unsafe or whether *any* rounding
there moves the loss that much.  This script answers it: over the bench's input batches it
prints the median loss (or, for inference, output) error against float32 of

* TensorFlow's rewrite and ours (``--lists``, default ``optimal``), as bench.py measures them;
* the float32 graph with its input rounded (bench.py's floor);
* the float32 graph with only the ``--tensor`` outputs rounded to the precision and back,

and, per variant, on how many batches its error is below TensorFlow's rewrite's.
``--image-side N`` rebuilds an image model at an N x N input (``models.resized``), to see
whether a gap is the benchmark size's: at 75x75, InceptionV3's last batch norms reduce two
values per channel at batch 2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import tensorflow as tf  # noqa: E402

import amp_rewrite  # noqa: E402
import bench  # noqa: E402
import corpus  # noqa: E402
import models  # noqa: E402  (bench/models.py: the benchmark's larger models)
from calibrate_casts import with_round_trips  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graph", required=True, help="a corpus item")
    ap.add_argument("--tensor", action="append", default=[], metavar="NODE",
                    help="round output 0 of NODE (repeatable: all at once)")
    ap.add_argument("--image-side", type=int, metavar="N",
                    help="build the image model at an N x N input instead of the benchmark's size")
    ap.add_argument("--precision", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--lists", default="optimal")
    ap.add_argument("--batches", type=int, default=16)
    args = ap.parse_args(argv)
    models.register()
    graph = args.graph
    if args.image_side:
        model, _, kind = graph.partition("/")
        try:
            graph = f"{models.resized(model, args.image_side)}/{kind}"
        except KeyError as exc:
            raise SystemExit(f"perturb.py: {exc.args[0]}") from None

    item = corpus.build(graph)
    gd, fetches = item.graph_def, list(item.fetches)
    missing = sorted(set(args.tensor) - {n.name for n in gd.node})
    if missing:
        raise SystemExit(f"not nodes of {graph}: {', '.join(missing)}")
    dtype = tf.as_dtype(args.precision)
    bf16 = args.precision == "bfloat16"
    shapes = {ph: v.shape for ph, v in item.variables.items()}
    ours = amp_rewrite.rewrite_graph_def(
        gd, target="auto" if bf16 else "gpu:8.0", precision=args.precision, fetches=fetches,
        use_env=False, lists=args.lists, variable_shapes=shapes).graph_def
    variants = {
        "tensorflow": bench.tf_amp_rewrite(gd, fetches, mode="bf16" if bf16 else "cuda"),
        f"ours ({args.lists})": ours,
        "float32, input rounded": None,
    }
    if args.tensor:
        variants[f"float32, {len(args.tensor)} tensor(s) rounded"] = with_round_trips(gd, args.tensor, dtype)
    batches = bench.input_batches(item, args.batches)
    ref = bench.outputs(gd, item, batches)
    width = 1 if item.kind == "training" else None  # the loss alone, as bench.py judges it
    errors: dict[str, list[float]] = {}
    for name, graph in variants.items():
        if graph is None:
            rounded = bench.rounded_inputs(batches, dtype)
            got = None if rounded is None else bench.outputs(gd, item, rounded)
        else:
            got = bench.outputs(graph, item, batches)
        if got is None:
            print(f"{name:36s} cannot run here")
            continue
        errors[name] = [bench.rel_error(o[:width], r[:width]) for o, r in zip(got, ref)]
    base = errors.get("tensorflow")
    for name, errs in errors.items():
        below = "" if base is None or name == "tensorflow" else \
            f"  below TensorFlow's on {sum(a < b for a, b in zip(errs, base))} of {len(errs)} batches"
        print(f"{name:36s} median {'loss' if width else 'output'} error {statistics.median(errs):.3g}{below}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
