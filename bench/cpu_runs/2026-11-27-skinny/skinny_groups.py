"""Group the convolutions of ``calibrate_in_place.py --dump`` files by op, weights (variable or
constant), flops band and output positions times batch (under 16, under 64, more), and print
each group's float32 time over the roofline and its bfloat16/float32 ratio net of the class's
fixed re-layout (``low_dense_overhead``): the numbers behind the skinny bands of the
cpu-avx512-bf16 class.  Usage: ``python skinny_groups.py DUMP [DUMP ...]``."""
import collections
import dataclasses
import gzip
import json
import os
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")]
from amp_rewrite.plan.cost_model import DEVICE_COSTS, conv_positions, node_cost  # noqa: E402

COSTS = DEVICE_COSTS["cpu-avx512-bf16"]
ROOFLINE = dataclasses.replace(COSTS, dense={})  # no bands: the roofline estimate itself
CONVS = ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")


def band(flops: float) -> str:
    return "<5M" if flops < 5e6 else "<20M" if flops < 2e7 else "<200M" if flops < 2e8 else ">=200M"


def main(paths: list[str]) -> None:
    acc = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for path in paths:
        with (gzip.open(path) if path.endswith(".gz") else open(path)) as f:
            rows = json.load(f)
        for r in rows:
            if r["op"] not in CONVS:
                continue
            ins = [tuple(s) if s else None for s in r["in_shapes"]]
            outs = [tuple(s) if s else None for s in r["out_shapes"]]
            constant = bool(r.get("constant_weights"))
            roof = node_cost(r["op"], ins, outs, 2, ROOFLINE, constant_weights=constant)
            pos = conv_positions(r["op"], ins, outs)
            rows_kind = "?" if pos is None else "P<16" if pos < 16 else "P<64" if pos < 64 else "P>=64"
            fixed = 0.0 if constant and "Filter" not in r["op"] else COSTS.low_dense_overhead / 1e3
            a = acc[(r["op"], "const" if constant else "var", band(roof.flops), rows_kind)]
            a[0] += 1
            a[1] += r["f32_us"]
            a[2] += r["bf16_us"] - fixed
            a[3] += roof.high / 1e3
    print(f"{'op':22s}{'weights':8s}{'flops':8s}{'rows':7s}{'nodes':>6s}{'f32 us':>10s}{'f32/roof':>10s}{'bf16/f32':>10s}")
    for k in sorted(acc):
        n, f32, bf16, roof = acc[k]
        print(f"{k[0]:22s}{k[1]:8s}{k[2]:8s}{k[3]:7s}{n:6d}{f32:10.0f}{f32 / roof:10.2f}{bf16 / f32:10.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
