"""The sweep file: what a user writes, and the checked `Sweep` every later stage reads.

Owns the schema (`schema`), the validated sweep (`schema.Sweep`, `schema.Cluster`), the catalogues a
sweep file names (`models`: presets and model shapes, `hardware`: the GPU table, `hf_config`: a Hugging
Face config.json), the goal (`goal`), the checks of free text (`checks`), and reading a file
(`loader`, with its messages in `messages`).

Nothing is re-exported here: a module imports from the module that defines a name, so importing a
low module of this package never runs the loader (which checks a sweep against the layout rules and
the trainers, and so sits above them).

May import: foundation, profiles.
Reading a file (loader, messages) may also import: layouts, trainers.
"""
