"""Whole sweeps through a real engine (SLURM, torchx on Ray), `sweep run` to `sweep best`."""
