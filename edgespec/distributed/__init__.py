"""Speculative decoding on a target sharded over several processes or machines with MLX's own
distributed engine (mx.distributed, mlx.launch) and mlx-lm's sharding.

launch: what the launcher's environment says (no MLX import); group: the group, and the check
that its ranks stay in step; shard: loading a target split tensor- or pipeline-parallel;
probe: per-forward and per-collective latencies for the bench; serve: what rank 0 of a served
group sends the others (requests, cancellations). (Delayed links between ranks, to
simulate slower networks, are research tooling: research/measure/simlink.py.)
"""
