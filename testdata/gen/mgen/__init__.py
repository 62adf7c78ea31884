"""Helpers for testdata/gen/megatron_fixtures.py (Megatron-LM legacy torch checkpoints)."""
