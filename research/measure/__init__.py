"""One-off measurement scripts: the distributed latency sweep (latency_sweep, over delayed links
from simlink) and the cost of a broadcast between ranks (broadcast_cost)."""
