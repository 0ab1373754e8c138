"""Tests of dashboards, laid out like the source."""
