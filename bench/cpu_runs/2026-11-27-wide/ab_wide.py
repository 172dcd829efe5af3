"""The CPU class's convolution bands as they were (old) against refitted in the 5-200 Mflop
ranges (new, ``fit_conv_bands.py --ranges 2e7,2e8`` on the calibration dumps): the optimal
bfloat16 plans of each item, their estimates, and, where the plans differ, float32, both plans
and float32 again timed interleaved (``bench.interleaved_step_times``, three sets of fresh
sessions).  ``NUMERICS=1``: also the median loss error (training steps) or output error of both
plans over 16 batches; ``TIME=0``: no timing; ``DUMPS=4``: the first refit, on the first
four dumps.  Old is rebuilt from ``OLD_BANDS``, so this runs the same before and after the
class took the refit.  Usage: ``B=2 R=12 OUTF=ab.json python ab_wide.py resnet50/training,...``."""
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), os.path.join(HERE, "..", "..", "..")]
import bench as B  # noqa: E402
import fit_conv_bands as F  # noqa: E402
import models as M  # noqa: E402

from amp_rewrite.plan import cost_model as cm  # noqa: E402

#: The first four fitted the first refit (``ab_b2.json``/``ab_b8.json``, ``DUMPS=4``); all six
#: the second, which the class now holds.
DUMPS = list(F.CLASS_DUMPS)[:int(os.environ.get("DUMPS", "6"))]
CLASS = "cpu-avx512-bf16"
_D = cm.DenseBand
#: The convolution bands before the refit (commit 23a2ead; its skinny tiers applied to variable
#: weights only, as ``constant_weights=False`` says now).
OLD_BANDS = {
    "Conv2D": (_D(5e6, 2.3, 0.8), _D(2e7, 1.21, 1.74, 16, False), _D(2e7, 0.73, 1.0, 64, False), _D(2e7, 1.0, 0.86),
               _D(2e8, 1.23, 1.0, 16, False), _D(2e8, 0.53, 0.81, 64, False), _D(2e8, 0.55, 0.64),
               _D(math.inf, 0.2, 0.57)),
    "Conv2DBackpropInput": (_D(5e6, 2.9, 0.74), _D(2e7, 1.45, 0.63), _D(2e8, 1.05, 0.5), _D(math.inf, 0.4, 0.5)),
    "Conv2DBackpropFilter": (_D(5e6, 3.8, 1.0), _D(2e7, 1.4, 0.97), _D(2e8, 0.85, 1.0), _D(math.inf, 0.42, 0.66)),
}
CURRENT = cm.DEVICE_COSTS[CLASS]
OLD = F.refitted(CURRENT, OLD_BANDS)
NEW = F.refitted(OLD, F.fit_bands(F.load(DUMPS), OLD, ranges=(2e7, 2e8)))
assert OLD.dense != NEW.dense


def main(names: list[str]) -> dict:
    M.register()
    M.set_batch(int(os.environ.get("B", "2")))
    M.set_weights(os.environ.get("W", "init"))
    res = {}
    for name in M.resolve_items(names):
        item = M.corpus.build(name)
        res[name] = B.ab_cost_classes(name, item, {"old": OLD, "new": NEW}, CLASS,
                                      numerics=os.environ.get("NUMERICS") == "1",
                                      timing=os.environ.get("TIME", "1") == "1",
                                      repeats=int(os.environ.get("R", "12")), iters=int(os.environ.get("I", "3")))
    return res


if __name__ == "__main__":
    result = main(sys.argv[1].split(","))
    with open(os.environ.get("OUTF", "ab_wide.json"), "w") as f:
        json.dump(result, f, indent=1)
