"""`edgespec distill`: train a small draft for a target on the target's own answers.

Stages (each resumable): `data` (the target answers the project's own instructions, written as
token shards), `train` (soft-label KL from the target onto a few of its own layers + a reduced
head), `export` (quantized draft folder + model card), `evaluate` (agreement, acceptance, speed).
"""
