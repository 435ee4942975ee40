"""`edgespec serve`: an OpenAI-compatible HTTP API over the Engine.

app (routes) -> protocol (request validation) / responses (bodies) -> worker (the MLX thread, a
FIFO queue, cancellation) -> prefix (conversations' cache sets, LRU within a byte budget) and
stops (exact stop strings); limits (body size, request time, prompts certain to overflow), guard
(connection deadline and cap, under uvicorn's h11 protocol) and auth (the API key) hold off
hostile clients; sharded serves a target split over an mlx.launch group (rank 0 answers). Needs
the `serve` extra: pip install 'edgespec[serve]'.
"""
