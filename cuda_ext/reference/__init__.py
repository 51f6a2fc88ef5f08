"""Pure-PyTorch references of every cuda_ext op: the CPU path and the test oracle."""
