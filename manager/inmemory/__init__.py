"""In-memory delivery: overlays served to the engine's interpreters from signed prepared plans, nothing written.

Standard library only, and importing nothing of `manager` beyond state, overlays.plankey and overlays.plans
(with durable and targets, which they import): `overlay bundle` copies these modules into its `memory/`
directory as the package `overlay_memory`, which the engine's own python imports at start-up
(manager/compose/memory.py, docs/compose.md "In-memory delivery (read-only containers)").
"""
