"""The results: what one trial yields (`trial`), one Parquet row per finished trial (`rows`), the
results folder and who may write it (`folder`, `lock`, the study's storage: `study_guard`), the
sweep's identity (`identity`), the sweep file frozen beside its results (`frozen`), the noise
of measured steps (`noise`), and Parquet from elsewhere decoded under a byte budget (`parquet_bound`). No torch.

May import: foundation, profiles, spec, layouts, estimate, trainers, plan.
"""
