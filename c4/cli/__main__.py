"""`python -m c4.cli`: the same entry point as the `c4` console script."""
import sys

from c4.cli import main

sys.exit(main())
