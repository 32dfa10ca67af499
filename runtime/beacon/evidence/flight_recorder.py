"""This rank's PyTorch flight recorder (its last collectives), written beside its stacks on a stall and
on SIGTERM, so the doctor can say which collective the ranks did not all join.

What torch 2.13.0 does, found by running 2 gloo ranks under torchrun on CPU:
- gloo collectives are recorded once TORCH_FR_BUFFER_SIZE is set before the process group is made
  (`gloo:all_reduce`, `gloo:barrier`, ... with their collective sequence ids; the state stays
  `scheduled`: gloo marks no start or end);
- without an nccl timeout nothing writes them: `torch._C._distributed_c10d._dump_fr_trace()` returns
  the pickled dump (nccl's format, version 2.10), and this module writes it;
- its `pg_config` is wrong under gloo: one entry under an empty name, registered before the group was
  named, its ranks those of the last group made. Torch's analyser then cannot place any entry
  (KeyError), so the dump gets this process's groups instead (name, description, global ranks), as
  nccl's own dump has them.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("beacon.flight_recorder")


def dump_flight_recorder(path: Path) -> bool:
    """This process's flight recorder into `path` (replaced whole); False when there is nothing to write
    (torch.distributed not in use, the recorder off) or it could not be written. Never raises."""
    # Looked up, never imported: a process without torch.distributed pays nothing.
    distributed: Any = sys.modules.get("torch.distributed")
    try:
        if distributed is None or not distributed.is_available() or not distributed.is_initialized():
            return False
        from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]  # loaded already

        dump = pickle.loads(_dump_fr_trace())
        if not dump.get("entries"):
            return False  # TORCH_FR_BUFFER_SIZE unset: an empty dump says nothing
        named = {name: group for name, group in dump.get("pg_config", {}).items() if name}
        dump["pg_config"] = {**_process_groups(distributed), **named}  # what torch named itself stands
        temporary = path.with_name(f".{path.name}.tmp")  # dot files are never uploaded half-written
        temporary.write_bytes(pickle.dumps(dump))
        os.replace(temporary, path)
        return True
    except Exception as error:  # evidence is best effort: the run goes on whatever torch raised
        log.warning("cannot write the flight recorder to %s: %s", path, error)
        return False


def _process_groups(distributed: Any) -> dict[str, dict[str, str]]:
    """Every process group of this process as nccl's dump lists it: name -> name, description, global ranks."""
    groups = {}
    for group, name in distributed.distributed_c10d._world.pg_names.items():
        ranks = sorted(distributed.get_process_group_ranks(group))
        groups[name] = {"name": name, "desc": getattr(group, "group_desc", "undefined"), "ranks": str(ranks)}
    return groups
