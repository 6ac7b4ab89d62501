"""Schedulers: direct, dynamic batcher, sequence batcher, ensemble."""
