"""Tests of runners, laid out like the source."""
