"""Recipes that made the embedded draft (make_prompts, gpu_distill, import_draft)."""
