"""Helpers for testdata/gen/deepspeed_fixtures.py (DeepSpeed ZeRO-1/2 checkpoint generator)."""
