"""`python -m bench_server ...` is the `cpbench` command."""

from bench_server.cli import main

if __name__ == "__main__":
    main()
