"""Layouts: the frozen value of one parallel configuration, the columns of many, and the validity
rules that decide which can run (`layout`; the context- and expert-parallel rules in `moe`, the
`Rule` type in `rule`), and the pipeline's stage geometry (`stages`). Pure numpy.

The trainer's capabilities come in through `Sweep.trainer` (`sweeper.spec.traits.TrainerTraits`).

May import: foundation, spec.
"""
