"""The test harness's own pieces: the local SLURM cluster, the Ray head and Docker daemon, the reference files."""
