"""`grouped_gemm.ops.gmm` on CPU: see __init__.py."""

import torch


def gmm(a, b, batch_sizes, trans_b=False):
    """Grouped GEMM: rows [s_i, s_i + batch_sizes[i]) of a times b[i] (b[i]^T with trans_b).

    a: [sum(batch_sizes), k]; b: [groups, k, n] ([groups, n, k] with trans_b); batch_sizes: one count
    per group (grouped_gemm takes an int64 CPU tensor). Returns [sum(batch_sizes), n] in a's dtype.
    """
    sizes = [int(x) for x in torch.as_tensor(batch_sizes).reshape(-1).tolist()]
    if len(sizes) != b.shape[0]:
        raise ValueError(f"gmm: {len(sizes)} batch sizes for {b.shape[0]} weight groups")
    if sum(sizes) != a.shape[0]:
        raise ValueError(f"gmm: batch sizes sum to {sum(sizes)} but a has {a.shape[0]} rows")
    outs, start = [], 0
    for i, n in enumerate(sizes):
        w = b[i].t() if trans_b else b[i]
        outs.append(a[start:start + n] @ w)
        start += n
    if not outs:
        return a.new_zeros((0, b.shape[1] if trans_b else b.shape[2]))
    return torch.cat(outs, dim=0)
