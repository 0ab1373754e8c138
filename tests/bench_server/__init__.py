"""Tests of bench_server, laid out like the source."""
