"""Entry point: ``python run.py [overrides]`` (same as the ``adtbench`` console script)."""

from adtbench.cli import main

if __name__ == "__main__":
    main()
