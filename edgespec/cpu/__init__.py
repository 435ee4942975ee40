"""MLX's CPU backend, made fast without changing a bit of what is computed.

- backend.py: the one entry point, `CpuBackend`, built once per Engine: a twin of each model that
  runs the optimised layers over the same weights (the model itself is left as mlx-lm made it),
  marked caches, `draft_pairs`, the sampling `softmax`, the draft-tree forward's pieces, and
  `Switches` (which rewrites are in force; the bench records them). Nothing else in EdgeSpec
  imports the modules below it.
- twin.py: a model's twin (new module objects, the same arrays, some of another class).
- switch.py: the backend check and the switches (`EDGESPEC_CPU_OPT=0` turns everything off).
- blas.py: the optimised BLAS the `edgespec` command (and pytest, pytest_blas.py) preloads by
  re-executing itself before MLX loads. This package's __init__ imports nothing, so that
  `edgespec.cpu.blas` can run before MLX is imported.
- attention.py (grouped verify attention), rope.py (rotary tables), leanops.py (lean Linear /
  RMSNorm), blocks.py (compiled llama blocks), rowpad.py (one-row products as two rows, opt-in),
  fastexp.py (a faster, more accurate softmax for sampling).
"""
