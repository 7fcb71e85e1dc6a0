"""The results: what one trial yields (`trial`), one Parquet row per finished trial (`rows`), the
results folder and who may write it (`folder`, `lock`, the study's storage: `study_guard`), the
sweep's identity (`identity`), the sweep file frozen beside its results (`frozen`), and the noise
of measured steps (`noise`). No torch.

May import: foundation, profiles, spec, layouts, estimate, trainers, plan.
"""
