"""sweeper/run: the sweep loop's parts (early stopping, the Optuna study per sweep) and `sweep profile`."""
