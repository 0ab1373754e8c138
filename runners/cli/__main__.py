"""`python -m runners.cli ...`: the engine's verbs of the `cpbench` command (all but `serve`, see `bench_server.cli`)."""

from runners.cli import main

if __name__ == "__main__":
    main()
