"""`python -m benchmarks`: see `benchmarks.cli`, or `python -m benchmarks --help`."""

import sys

from benchmarks.cli import main

sys.exit(main())
