"""The range of every number a command-line flag takes, each written once.

A declared job option, operations option or layout dimension (``planner.core.layout.Job``,
``planner.core.options.OpsOptions``, ``planner.core.layout.Layout``) carries its bounds in its
declaration (``low``/``high``, or a dimension's ``choices``): the explorer offers that range and a
flag accepts the same one. Flags that are no declared option (GPU counts, the model's shape,
hardware overrides, ports, ...) and options declared without bounds keep theirs in
``planner.schema.FLAGS`` (a base module: it cannot see the declarations). ``FLAGS`` below is
both; docs/cli.md's Limits table is ``limits_markdown(FLAGS)``, and a test keeps them equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from planner.core.layout import JOB_OPTIONS, LAYOUT_DIMS, Dim, Option
from planner.core.options import OPS_OPTIONS
from planner.schema import FLAGS as OTHER_FLAGS
from planner.schema import Key
from planner.schema import check_flags as check_against

# Where the explorer's lower bound encodes something a flag says otherwise: its global batch of
# 0 means "the default" (a flag leaves it out), its 0 hours between failures means none (a flag
# says inf), its 0 steps between evaluations means none (a flag leaves it out). The upper bounds stay the declared ones.
_AS_FLAG = {"global_batch": {"lo": 1}, "mtbf_gpu_hours": {"lo_open": True, "inf_ok": True},
            "eval_every_steps": {"lo": 1, "unit": "steps"}}
# Options declared without explorer bounds that take a sibling's range.
_SAME_AS = {"mtbf_node_hours": "mtbf_gpu_hours", "storage_write_gbps": "storage_gbps",
            "storage_read_gbps": "storage_gbps"}


def _dim_key(d: Dim) -> Key | None:
    if d.type is not int:
        return None
    return Key(int, d.low, max(d.choices) if d.choices else d.high)


def _option_key(o: Option) -> Key | None:
    if o.count or o.low is None or o.high is None or o.base_type not in ("int", "float"):
        return None  # counts (1T) are checked by planner.units.parse_count; unbounded ones by schema
    key = Key(int if o.base_type == "int" else float, o.low, o.high)
    return dataclasses.replace(key, **_AS_FLAG.get(o.name, {}))


def _declared() -> dict[str, Key]:
    # Dimensions first: a job option of the same name (global_batch, the flag's owner) replaces it.
    keys = {d.name: _dim_key(d) for d in LAYOUT_DIMS if d.pinnable}
    keys |= {o.name: _option_key(o) for o in (*JOB_OPTIONS, *OPS_OPTIONS)}
    keys |= {name: keys[sibling] for name, sibling in _SAME_AS.items()}
    return {name: key for name, key in keys.items() if key is not None}


DECLARED_FLAGS: dict[str, Key] = _declared()
FLAGS: dict[str, Key] = {**DECLARED_FLAGS, **{k: v for k, v in OTHER_FLAGS.items() if k not in DECLARED_FLAGS}}


def check_flags(values: Mapping[str, Any]) -> None:
    """Parsed command-line flags (``vars(args)``) against ``FLAGS``; raises on the first bad one."""
    check_against(values, FLAGS)
