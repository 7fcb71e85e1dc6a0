"""The search: which layout runs next (`search`, over node counts: `sizes`), the belief it acts on
(the model recalibrated and its residual: `residual`, `learn`, `acquisition`), its Optuna study
(`study`, `schedule`, `stopping`), and what earlier sweeps taught (`prior`, `learned`, `remember`).

May import: foundation, profiles, spec, layouts, estimate, trainers, plan, results.
"""
