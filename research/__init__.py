"""EdgeSpec's research tooling: corpus builders, draft recipes and one-off measurements.

Not installed with the package: run from a clone's root (`python -m research.recipes.draft_r2 ...`).
It imports edgespec; edgespec never imports it (tests/project/test_imports.py checks).
"""
