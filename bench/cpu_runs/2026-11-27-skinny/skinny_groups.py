"""Group the convolutions of ``calibrate_in_place.py --dump`` files by op, weights (variable or
constant), flops band and output positions times batch (under 16, under 64, more), and print
each group's float32 time over the roofline and its bfloat16/float32 ratio net of the class's
fixed re-layout (``low_dense_overhead``): the numbers behind the skinny bands of the
cpu-avx512-bf16 class (the groups ``bench/fit_conv_bands.py`` fits bands to).  Usage:
``python skinny_groups.py DUMP [DUMP ...]``."""
import math
import os
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")]
import fit_conv_bands  # noqa: E402  (its groups: op, weights, flops range, positions tier)

from amp_rewrite.plan.cost_model import DEVICE_COSTS  # noqa: E402


def _label(edge: float) -> str:
    return ">=200M" if edge == math.inf else f"<{edge / 1e6:g}M"


def main(paths: list[str]) -> None:
    acc = fit_conv_bands.group_sums(fit_conv_bands.load(paths), DEVICE_COSTS["cpu-avx512-bf16"])
    print(f"{'op':22s}{'weights':8s}{'flops':8s}{'rows':7s}{'nodes':>6s}{'f32 us':>10s}{'f32/roof':>10s}{'bf16/f32':>10s}")
    rows = {(op, "const" if constant else "var", _label(edge), "P>=64" if tier == math.inf else f"P<{tier}"): sums
            for (op, constant, edge, tier), sums in acc.items()}
    for k in sorted(rows):
        n, f32, bf16, roof = rows[k]
        print(f"{k[0]:22s}{k[1]:8s}{k[2]:8s}{k[3]:7s}{n:6d}{f32:10.0f}{f32 / roof:10.2f}{bf16 / f32:10.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
