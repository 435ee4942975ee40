"""MLX's CPU backend, made fast without changing a bit of what is computed.

Imported only where MLX computes on the CPU (edgespec/backend.py `for_device`, the one place
that imports it): a Metal or CUDA process loads none of these modules.

- backend.py: the one entry point, `CpuBackend` (a subclass of edgespec.backend.Backend), built
  once per Engine: a twin of each model that runs the optimised layers over the same weights (the
  model itself is left as mlx-lm made it), the sampling `softmax`, the draft steps, the
  draft-tree forward's pieces, and `Switches` (which rewrites are in force, read once from
  EDGESPEC_CPU_OPT; the bench records them). Nothing else in EdgeSpec imports the modules below
  it. Its `twin` makes a model's twin (new module objects, the same arrays, some of another
  class).
- attention.py (grouped verify attention, and the attention's softmax in NumPy for rows that
  see a thousand keys or more), heads.py (the twins' attention modules, built with that
  attention), fused.py with attend.c (those rows' whole attention in one C kernel, built on
  first use with the system compiler), rope.py (rotary tables), leanops.py (lean Linear /
  RMSNorm), blocks.py (compiled llama blocks), fastexp.py (a faster, more accurate softmax for
  sampling), pairs.py (draft steps two rows at a time, under MKL).

The BLAS the process runs on is chosen before MLX loads, whatever the device: edgespec/blas.py.
docs/cpu-backend.md describes each rewrite and its measured effect.
"""
