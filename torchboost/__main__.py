"""`python -m torchboost` (what `torchrun ... -m torchboost train` runs)."""

import sys

from .cli import main

sys.exit(main())
