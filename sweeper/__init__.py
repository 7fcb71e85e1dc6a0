"""sweep: find the fastest parallel layout for training a large transformer on a SLURM cluster."""

__version__ = "0.1.0"
