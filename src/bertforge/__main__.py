"""``python -m bertforge`` (also what ``torchrun -m bertforge`` runs)."""

import sys

from bertforge.cli import main

sys.exit(main())
