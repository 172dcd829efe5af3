"""The held-out check of ``fit_conv_bands.py`` for five ways to refit, against the class as it
was before the refit (``ab_wide.OLD_BANDS``), over the six dumps: which ranges to refit, with
or without positions tiers, held out by model and by dump.  Prints what
``holdout_variants.txt`` holds.  Usage: ``python holdout_variants.py``."""
import contextlib
import io
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", ".."), os.path.join(HERE, "..", "..", "..")]
import ab_wide  # noqa: E402  (its OLD: the class before the refit)
import fit_conv_bands as F  # noqa: E402

from amp_rewrite.plan import cost_model as cm  # noqa: E402

cm.DEVICE_COSTS[ab_wide.CLASS] = ab_wide.OLD
for by in ("model", "dump"):
    for args in ([], ["--ranges", "2e7,2e8"], ["--ranges", "2e7,2e8", "--no-skinny"], ["--no-skinny"],
                 ["--ranges", "5e6,2e7,2e8"]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            F.main(ab_wide.DUMPS + ["--holdout", by] + args)
        print(f"## --holdout {by} {' '.join(args)}  ('class as it is': the bands before the refit)")
        print("\n".join(out.getvalue().splitlines()[-2:]))
