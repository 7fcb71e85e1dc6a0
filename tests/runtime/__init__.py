"""sweeper/runtime: the built-in PyTorch trainer over real gloo ranks (parity with one process, memory, kernels) and its workloads."""
