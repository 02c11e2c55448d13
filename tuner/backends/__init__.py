"""What a module runs under (eager, inductor/AOTInductor, torch.compile, CUDA graphs, XLA),
compiled in a child process where a crash or an overrun must not end the run, with compile
times estimated from this machine's history."""

from tuner.backends.registry import load_aoti

__all__ = ["load_aoti"]
