"""Op lists of amp_rewrite, shipped as package data (``amp_rewrite._lists``).

This directory holds data only; see ``amp_rewrite.plan.lists`` for the schema and the loader.
"""
