"""Microseconds per layer step vs the docs/design.md §8 floor and the eager reference: see
``dsv41.bench``."""

import sys

from dsv41.bench import main

if __name__ == "__main__":
    sys.exit(main())
