"""ZeRO-3 partitioning arithmetic, as DeepSpeed does it.

Sources (DeepSpeed, read not copied):
* deepspeed/runtime/zero/partition_parameters.py `_padding_size`, `_aligned_size`, `_partition_param`:
  every parameter is partitioned on its own over the DP group; aligned size = n rounded up to a
  multiple of D, partition size Pn = aligned/D = ceil(n/D); rank r copies flat[r*Pn, r*Pn+Pn) clipped
  to n into a `torch.empty(Pn)` buffer, so its tail (the padding) is whatever memory held.
* deepspeed/runtime/zero/stage3.py `_create_fp16_sub_groups`: inside one optimizer param group,
  trainable params are appended to a sub-group until the sum of their partition sizes reaches
  `sub_group_size` (>=) or the group's last param is reached; if sub_group_size >= the whole group's
  partition total, the group is one sub-group. Sub-groups are numbered globally in param-group order.
"""


def partition_numel(n, dp):
    """Pn = ceil(n / D); 0 for an empty parameter."""
    return -(-n // dp)


def padding(n, dp):
    """Padding elements ZeRO-3 adds to a parameter of n elements: D*Pn - n."""
    return dp * partition_numel(n, dp) - n


def valid(n, dp, rank):
    """Real (non-padding) elements of the parameter held by `rank`."""
    pn = partition_numel(n, dp)
    return max(0, min(pn, n - rank * pn))


def sub_groups(names, numels, dp, sub_group_size):
    """Split one param group (names in group order) into sub-groups, as _create_fp16_sub_groups does."""
    pns = [partition_numel(n, dp) for n in numels]
    if sub_group_size is None or sub_group_size >= sum(pns):
        return [list(names)]
    out, cur, acc = [], [], 0
    for i, (name, pn) in enumerate(zip(names, pns)):
        cur.append(name)
        acc += pn
        if acc >= sub_group_size or i == len(names) - 1:
            out.append(cur)
            cur, acc = [], 0
    return out
