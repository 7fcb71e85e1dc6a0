"""The models: what a layout costs before it runs. Memory (`memory`, and learning it both ways in
a sweep: `memfit`), FLOPs (`flops`), collectives (`comm`), the step time from the GPU table
(`step_time`, with the context- and expert-parallel terms in `moe`) or from a measured profile
(`profiled`, from a block's work, `profiled_work`, and what the host and its cores
add, `host`, over the shapes it measures: `shapes`), the choice between the two (`predict`), and
the whole training run's days and cost (`cost`). Pure: numpy, no torch.

The trainer and its memory recipe come in through `Sweep.trainer` and `Sweep.memory_recipe`.

May import: foundation, profiles, spec, layouts.
"""
