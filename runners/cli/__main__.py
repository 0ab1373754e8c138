"""`python -m runners.cli ...` is the `cpbench` command."""

from runners.cli import main

if __name__ == "__main__":
    main()
