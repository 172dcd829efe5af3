"""What the default profile's normalization rule costs in float16 error: the float16 rewrite for
a GPU 8.0 of corpus graphs with TensorFlow's pass, the default profile, and the default
profile without its ``[normalization]`` table (``default_without_normalization_rule.toml``,
lists/default.toml with that table taken out), each graph's median error of its first output
(a training step's loss) over the 16 input batches ``bench.py`` uses.

Usage (from the repository root)::

    python bench/cpu_runs/2026-11-27-headline/normalization_rule_numerics.py transformer/inference bert_like/inference resnet50/training

Runs the graphs on this CPU (float16 emulated); times nothing.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")
sys.path[:0] = [os.path.join(ROOT, "bench"), ROOT]

import amp_rewrite  # noqa: E402
import bench  # noqa: E402
from models import corpus, register  # noqa: E402
from tf_oracle import tf_amp_rewrite  # noqa: E402

WITHOUT_RULE = os.path.join(HERE, "default_without_normalization_rule.toml")


def errors(name: str) -> dict[str, float]:
    """Median first-output error of each float16 rewrite of ``name`` against float32."""
    item = corpus.build(name)
    gd, fetches = item.graph_def, list(item.fetches)
    shapes = bench.variable_shapes(item)
    batches = bench.input_batches(item, 16)
    ref = bench.outputs(gd, item, batches)

    def ours(**lists) -> object:
        return amp_rewrite.rewrite_graph_def(gd, target="gpu:8.0", fetches=fetches, use_env=False,
                                             variable_shapes=shapes, **lists).graph_def

    graphs = {"tensorflow": tf_amp_rewrite(gd, fetches), "default": ours(),
              "default_without_rule": ours(lists=WITHOUT_RULE)}
    return {label: bench.median_error([bench.rel_error(o[:1], r[:1])
                                       for o, r in zip(bench.outputs(g, item, batches), ref)])
            for label, g in graphs.items()}


if __name__ == "__main__":
    register()
    for graph in sys.argv[1:]:
        print(graph, {k: f"{v:.3e}" for k, v in errors(graph).items()}, flush=True)
