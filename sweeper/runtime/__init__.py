"""The built-in trainer's runtime: what each rank of a trial runs (PyTorch: the model, its
parallelisms, the measured steps, `sweep profile`'s measurements), and an external trainer's
command (`workloads`). The only package that imports torch; not to be confused with
`sweeper.trainers`, which describes every trainer to the planner.

May import: foundation, profiles, spec, layouts, estimate, trainers, plan, results.
"""
