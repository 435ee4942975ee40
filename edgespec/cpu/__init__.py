"""MLX's CPU backend, made fast without changing a bit of what is computed.

- rewrites.py: the one entry point (`optimise(model)`, `new_cache`, `draft_pairs`,
  `sampling_softmax`, `switches`) the Engine calls; nothing else in EdgeSpec imports the modules
  below it.
- switch.py: the backend check and the switches (`EDGESPEC_CPU_OPT=0` turns everything off).
- blas.py: the optimised BLAS the `edgespec` command (and pytest, pytest_blas.py) preloads by
  re-executing itself before MLX loads. This package's __init__ imports nothing, so that
  `edgespec.cpu.blas` can run before MLX is imported.
- attention.py (grouped verify attention), rope.py (rotary tables), leanops.py (lean Linear /
  RMSNorm), blocks.py (compiled llama blocks), rowpad.py (one-row products as two rows, opt-in),
  fastexp.py (a faster, more accurate softmax for sampling).
"""
