"""sweeper/launchers: the contract every launcher keeps, and each launcher (local, netns, SLURM, torchx, replay)."""
