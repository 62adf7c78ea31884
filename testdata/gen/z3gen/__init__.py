"""Helpers for zero3_fixtures.py: synthetic DeepSpeed ZeRO-3 checkpoints from known full tensors."""
