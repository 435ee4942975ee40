"""Model architectures EdgeSpec defines itself (one module per model), beside mlx-lm's."""
