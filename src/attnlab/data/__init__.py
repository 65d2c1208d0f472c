"""Data sets and batching."""
