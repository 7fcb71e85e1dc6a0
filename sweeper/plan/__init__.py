"""The plan: every layout of the cross product with its status and reason (`plan`), the dry run
as records (`summary`), and the answer per node count (`sizes`). Pure.

May import: foundation, profiles, spec, layouts, estimate, trainers.
"""
