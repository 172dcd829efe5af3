"""Stage 2, **decide**: graph + lists + target -> a plan with a colour, dtype and reason for
every (node, type attribute).  Pure: nothing here modifies a graph it is given.

:mod:`.lists` loads the allow/infer/deny/clear lists (data in ``lists/``); :mod:`.targets`
says which devices can profit and which low type is fast; :mod:`.painter` runs TensorFlow's
passes in TensorFlow's order; the cost-aware planners plug into it through
:class:`.painter.Placement`: :mod:`.optimal` prices colourings with :mod:`.cost_model`, keeps
fragile normalizations float32 (:mod:`.normalization`) and solves a minimum cut
(:mod:`.mincut`); :mod:`.exclude` keeps the user's patterns float32.  Imports only
:mod:`amp_rewrite.graph` and :mod:`amp_rewrite.errors` from outside.
"""
