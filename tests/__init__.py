"""Tests of tests, laid out like the source."""
