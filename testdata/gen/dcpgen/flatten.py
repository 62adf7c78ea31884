"""DCP's state-dict flattening (DefaultSavePlanner(flatten_state_dict=True)).

Two traversal rules exist (torch/distributed/checkpoint/_traverse.py):

* "2.4" (torch >= 2.4): every Mapping is descended into (an empty one yields no key); a list is
  descended into (int path elements) only when one of its entries is a tensor or a non-terminal
  Mapping/list; tuples and everything else are leaves.
* "2.3" (torch <= 2.3): a Mapping or list is a leaf unless it (recursively) holds a tensor, so a
  tensor-free dict such as an LR scheduler's state is stored whole as one bytes item.

The flattened key is ".".join(map(str, path)); dict keys enter the path as str(k), list positions as
ints. `is_tensor` decides what counts as a tensor (DTensor and ShardedTensor are tensors in torch).
"""

from collections.abc import Mapping


def traverse(state_dict, visit, is_tensor, rule="2.4"):
    if rule == "2.4":
        def terminal(value):
            if isinstance(value, Mapping):
                return False
            if not isinstance(value, list):
                return True
            for entry in value:
                if isinstance(entry, (Mapping, list)) and not terminal(entry):
                    return False
                if is_tensor(entry):
                    return False
            return True

        def walk(path, value):
            if isinstance(value, Mapping):
                for k, v in value.items():
                    walk(path + (str(k),), v)
            elif terminal(value):
                visit(path, value)
            elif isinstance(value, (list, tuple)):
                for i, v in enumerate(value):
                    walk(path + (i,), v)
    elif rule == "2.3":
        def terminal(value):
            if isinstance(value, Mapping):
                entries = value.values()
            elif isinstance(value, list):
                entries = value
            else:
                return True
            for entry in entries:
                if isinstance(entry, (Mapping, list)) and not terminal(entry):
                    return False
                if is_tensor(entry):
                    return False
            return True

        def walk(path, value):
            if terminal(value):
                visit(path, value)
            elif isinstance(value, Mapping):
                for k, v in value.items():
                    walk(path + (str(k),), v)
            elif isinstance(value, list):
                for i, v in enumerate(value):
                    walk(path + (i,), v)
    else:
        raise ValueError(f"unknown flattening rule {rule!r}")

    for key, value in state_dict.items():
        walk((str(key),), value)


def flatten_state_dict(state_dict, is_tensor, rule="2.4"):
    """Returns (flat dict key -> value, mappings key -> path tuple), both in traversal order."""
    flat = {}
    mappings = {}

    def visit(path, value):
        key = ".".join(map(str, path))
        if key in flat:
            raise ValueError(f"duplicated flatten key {key}")
        flat[key] = value
        mappings[key] = path

    traverse(state_dict, visit, is_tensor, rule)
    return flat, mappings


def set_element(root, path, value):
    """Rebuild nesting the way torch's set_element does: str keys make dicts, int keys make lists
    (extended with None)."""
    cur = root
    for i in range(1, len(path)):
        prev, key = path[i - 1], path[i]
        default = {} if type(key) is str else []
        if isinstance(cur, Mapping):
            cur = cur.setdefault(prev, default)
        else:
            while len(cur) <= prev:
                cur.append(None)
            if cur[prev] is None:
                cur[prev] = default
            cur = cur[prev]
    key = path[-1]
    if type(key) is int:
        while len(cur) <= key:
            cur.append(None)
    cur[key] = value
