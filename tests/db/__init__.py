"""Tests of db, laid out like the source."""
