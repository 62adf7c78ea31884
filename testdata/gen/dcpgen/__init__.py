"""Helpers for testdata/gen/dcp_fixtures.py: PyTorch Distributed Checkpoint fixtures.

standin  - stand-in classes pickled under DCP's exact module paths, one set per torch layout
flatten  - DCP's state-dict flattening (torch >= 2.4 rules and the older <= 2.3 rules)
sharding - torch.chunk / DTensor local-shard geometry
engine   - a single-process re-enactment of dcp.save with FileSystemWriter
cases    - the fixture cases: deterministic full tensors and per-rank state dicts
truth    - truth.pt assembly and sharding-pattern classification
reader   - an independent reader used to verify what was written (and to print layout.txt)
real     - the same cases written by real torch.distributed.checkpoint (torch >= 2.4, gloo)
"""
