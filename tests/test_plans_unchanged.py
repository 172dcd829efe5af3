"""Plans and rewritten graphs are byte-identical to those recorded before issue 25's
restructuring, on every corpus graph under every list profile, planner, level and target
(:mod:`plan_digests`).  A change that is meant to change plans re-records the digests with
``python tests/plan_digests.py --write`` and says why in its commit."""

from __future__ import annotations

import json

import pytest

import plan_digests

with open(plan_digests.GOLDEN) as _f:
    RECORDED = json.load(_f)


@pytest.mark.parametrize("name, config", plan_digests.keys(), ids=lambda v: v)
def test_plan_and_rewritten_graph_are_unchanged(name, config):
    assert plan_digests.digest(name, config) == RECORDED[f"{name}|{config}"]


def test_every_recorded_digest_is_checked():
    assert sorted(RECORDED) == sorted(f"{n}|{c}" for n, c in plan_digests.keys())
