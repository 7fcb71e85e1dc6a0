"""sweep: find the fastest parallel layout for training a large transformer on a SLURM cluster.

The package reads top to bottom as the data flows (DESIGN.md): the sweep file (`spec`) -> candidate
layouts (`layouts`) -> what each would cost (`estimate`, priced from measured `profiles`; every
trainer as an object: `trainers`) -> the plan (`plan`) -> the trials, their rows and the results
folder (`results`) -> which layout runs next (`search`) -> what runs inside a trial (`runtime`) and
where (`launchers`) -> the sweep loop (`run`) -> the report and the command (`report`, `cli`).

Foundation modules, imported from anywhere and importing only each other: `errors`, `files`,
`process`, `packages`, `knobs` (the search space's knobs and the layout columns), `statuses`, `text`
(text from elsewhere as data: one escaping function per medium).
Each folder's `__init__` says what it owns and, on its `May import:` line, which folders it may
import (tests/architecture/test_import_rules.py holds every module to it, and forbids import cycles).
"""

__version__ = "0.1.0"
