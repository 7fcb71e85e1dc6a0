"""The sweep loop: ask the search for layouts, run them through a launcher, record every outcome
(`orchestrator`, its state in `state`; what it does with an outcome: `slow_trials`, `unwritten`,
`rows_told`), and the other commands that run ranks: `sweep profile` (`profiler`) and
`sweep selftest` (`selftest`).

May import: foundation, profiles, spec, layouts, estimate, trainers, plan, results, search, runtime, launchers.
"""
