"""Gated DeltaNet (scalar gate per head): the fp32 reference in `naive.py`; the chunked op in `chunk.py`."""
