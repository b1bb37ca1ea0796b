"""``python -m bertforge`` (also what ``torchrun -m bertforge`` runs)."""

from bertforge.cli import run

run()
