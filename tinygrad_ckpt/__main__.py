"""`python -m tinygrad_ckpt ...`: the same command line as `tinygrad-ckpt ...` (cli.py)."""

import sys

from .cli import main

sys.exit(main())
