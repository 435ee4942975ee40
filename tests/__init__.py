"""EdgeSpec's tests, one folder per layer; every test module sits in one of them:

unit/         pure maths and sampling: acceptance, warps, metrics, tree shapes (no models)
loop/         the decoding loop and its caches on tiny seeded models: every drafting method, trees
cpu/          the CPU backend's rewrites: BLAS, grouped attention, rope tables, lean ops, blocks
loading/      loading and architectures: folders, GGUF, the catalogue, pull, every model family
server/       `edgespec serve`: protocol, limits, stop strings, worker thread, batching, HTTP
distributed/  a target sharded with mlx.distributed, under generate and serve
tui/          the chat app: Textual pilot, snapshots, a real terminal
cli/          the commands as users run them: generate, verify, bench, distill, MTP commands
real/         slow real-model tests on the embedded pair and the shipped feature-draft pair
research/     research/'s recipes, corpus and training pieces, and the GPU twin
project/      the repository's shape: imports, layout, the wheel, this map
helpers/      what the tests share: tiny models, numpy references, runners, fixtures' builders
plugins/      pytest plugins pyproject's addopts names (the BLAS re-exec before MLX loads)

conftest.py holds the shared fixtures. A test module imports helpers, never another test module
(tests/project/test_test_layout.py checks that, no test module at this root, and this map).
"""
