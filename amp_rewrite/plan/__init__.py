"""Stage 2, **decide**: graph + lists + target -> a plan with a colour, dtype and reason for
every (node, type attribute).  Pure: nothing here modifies a graph it is given.

:mod:`.lists` loads the allow/infer/deny/clear lists (data in ``lists/``); :mod:`.targets`
says which devices can profit and which low type is fast; :mod:`.painter` runs TensorFlow's
passes (:mod:`.passes`, functions over one :class:`.painting.PaintingState`) in TensorFlow's
order and returns a :class:`.decisions.Plan`.  The cost-aware planners plug into it through
:class:`.painting.Placement`, which the caller hands to :func:`.painter.decide` (the painter
imports no planner): :func:`.optimal.min_cut_placement` prices colourings with
:mod:`.cost_model`, keeps fragile normalizations float32 (:mod:`.normalization`) and solves a
minimum cut (:mod:`.mincut`, guarded by :mod:`.cut_guard`); :mod:`.exclude` and
:mod:`.preserve` keep the fetches and the user's patterns float32.  :mod:`.step_cost` prices a
whole graph node by node in the types it has (the cost model's step estimate, which the
benchmarks compare with measured steps, and which checks the optimal planner's plans:
:mod:`amp_rewrite.step_check`, above the rewrite stage); :mod:`.grappler_folds` says what
Grappler removes before a graph runs, for both.  Imports only
:mod:`amp_rewrite.graph` and :mod:`amp_rewrite.errors` from outside.
"""
