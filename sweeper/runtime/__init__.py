"""The built-in trial runner: a PyTorch-native LLaMA trainer for any layout (the only package that imports torch).

`runner.run_trial` runs one trial on the ranks of a job; `launch.launch_trial` starts those
ranks on this machine (without importing torch itself).
"""
