"""The modules at the top of sweeper/ that every room shares: knobs, errors, files, process."""
