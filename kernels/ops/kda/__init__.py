"""Kimi Delta Attention (per-key-dim gate): the fp32 reference in `naive.py`; the chunked op in `chunk.py`."""
