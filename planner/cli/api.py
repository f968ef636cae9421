"""The Python API: ``planner.estimate(**flags)`` and ``planner.search(**flags)``.

Each keyword is a flag of `planner estimate` / `planner search`, spelled as its destination
(``zero_stage``, ``micro_batch``, ``overlap_grad_reduce``) or as the flag with dashes made
underscores (``zero``, ``no_overlap``); the keywords and what each accepts are read from the same
argparse declarations the CLI builds (``planner.cli.main.SUBCOMMANDS``), and the result is the
dict the CLI prints with ``--format json`` (same keys, same numbers: both call
``planner.cli.main.estimate_plan`` / ``search_listing``). A bad keyword or value raises one
``PlannerError`` naming the field, the value and what is allowed.

The parser's declarations are read once per process; every call after the first converts its
keywords with a dict look-up each, and a call whose flags other than the layout's are those of a
recent call reuses that call's checked inputs (model, hardware, job, operations); the model is kept
apart from the rest, so a sweep over models builds the hardware and job once.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Mapping

from planner.errors import PlannerError, closest_names

# Flags the API leaves out: the result is always the JSON dict (format), and an API caller
# formats or plots for itself (plot writes a file: `planner estimate --plot` does).
_LEFT_OUT = ("format", "help")


class _Spec:
    """One subcommand's keywords: each name -> (its destination, a converter of the value)."""

    __slots__ = ("command", "defaults", "keys", "pins")

    def __init__(self, command: str) -> None:
        from planner.cli.main import SUBCOMMANDS, _Parser
        from planner.core.layout import PIN_DIMS
        from planner.core.limits import check_flags

        parser = _Parser(prog=f"planner {command}", add_help=False)
        SUBCOMMANDS[command][1](parser)
        self.command = command
        self.defaults = vars(parser.parse_args([]))
        check_flags(self.defaults)  # once: a call then checks only the values its keywords set
        self.pins = frozenset(d.name for d in PIN_DIMS)  # the layout's fields: not part of a setup's key
        self.keys: dict[str, tuple[str, Callable[[object], object]]] = {}
        for action in parser._actions:
            if action.dest in _LEFT_OUT:
                continue
            for flag in action.option_strings:
                name = flag.lstrip("-").replace("-", "_")
                # ``no_overlap=True`` is the flag given; the destination's own name takes its value.
                flips = name != action.dest and _flips(action, flag)
                self.keys[name] = (action.dest, _converter(action, negated=flips))
            self.keys.setdefault(action.dest, (action.dest, _converter(action, negated=False)))

    def namespace(self, flags: Mapping[str, object]) -> tuple[argparse.Namespace, dict[str, object]]:
        """The parsed flags, and those of them the keywords set (destination -> value; the rest
        are the parser's defaults, which ``__init__`` checked)."""
        given = {}
        for name, value in flags.items():
            try:
                dest, convert = self.keys[name]
            except KeyError:
                hint = closest_names(name, list(self.keys))
                raise PlannerError(name, value, f"not a keyword of planner.{self.command}"
                                   f"{'; ' + hint if hint else ''} (`planner {self.command} --help` "
                                   "lists the flags; a keyword is a flag with dashes made underscores)") from None
            given[dest] = convert(value) if value is not None else self.defaults[dest]
        a = argparse.Namespace()
        vars(a).update(self.defaults)
        vars(a).update(given)
        return a, given


def _flips(action: argparse.Action, flag: str) -> bool:
    """Whether ``flag`` given sets its destination to False (``--no-overlap``, ``--no-sequence-parallel``)."""
    if isinstance(action, argparse.BooleanOptionalAction):
        return flag.startswith("--no-")
    return isinstance(action, argparse._StoreFalseAction)


def _converter(action: argparse.Action, negated: bool) -> Callable[[object], object]:
    """The function that checks one keyword's value as the flag would and returns what argparse stores."""
    field = action.dest
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)):
        def boolean(value: object) -> bool:
            if not isinstance(value, bool):
                raise PlannerError(field, value, "True or False")
            return not value if negated else value
        return boolean
    kind, choices = action.type, action.choices
    plain = kind if kind in (int, float) else str if kind in (None, str) else None

    def convert(value: object) -> object:
        if type(value) is plain and (choices is None or value in choices):  # the usual case: as given
            return value
        if isinstance(value, bool):
            raise PlannerError(field, value, _wanted(kind, choices))
        if kind in (int, float):
            if isinstance(value, str):
                try:
                    value = kind(value)
                except ValueError:
                    raise PlannerError(field, value, _wanted(kind, choices)) from None
            elif kind is int and not isinstance(value, int) and not _is_integer(value):
                raise PlannerError(field, value, _wanted(kind, choices))
            elif kind is float and not isinstance(value, (int, float)) and not _is_number(value):
                raise PlannerError(field, value, _wanted(kind, choices))
            value = kind(value)
        elif isinstance(value, (list, tuple)):  # a list option (lora_targets): the flag's comma-separated text
            value = ",".join(map(str, value))
        elif isinstance(value, (int, float)):  # a count (params=33e9, tokens=1e12): the flag's text
            value = repr(value)
        elif not isinstance(value, str):
            raise PlannerError(field, value, _wanted(kind, choices))
        if choices is not None and value not in choices:
            raise PlannerError(field, value, _wanted(kind, choices))
        return value
    return convert


def _is_integer(value: object) -> bool:
    import numbers

    return isinstance(value, numbers.Integral)


def _is_number(value: object) -> bool:
    import numbers

    return isinstance(value, numbers.Real)


def _wanted(kind: object, choices) -> str:
    if choices is not None:
        return "one of " + ", ".join(map(str, choices))
    return {int: "an integer", float: "a number"}.get(kind, "text (as the flag takes it, e.g. '33B')")


_SPECS: dict[str, _Spec] = {}
# The inputs built from the flags that are not layout pins (model, hardware, job, operations), kept
# for the next call with the same ones (a sweep over layouts builds them once): checked and built
# the first time as the CLI does. Not kept for a Hugging Face config (its file may change between
# calls) or a value that is no key (a list). ``clear_cache()`` empties it.
_SETUP: dict[tuple, object] = {}
_SETUP_SIZE = 64
# A setup's two parts, each kept by the values it is built from: ("model", the model's keywords) ->
# ``model_from``'s (model, note); (the command, the other keywords) -> ``setup_from``'s Setup (GPUs,
# hardware, job; the pins and operations are read again with each setup built).
_PARTS: dict[tuple, object] = {}


# The last calls' flags, exactly as given (each value's type too: True is no 1 here), and what
# ``_prepared`` made of them: a call repeating them (the same estimate asked again) skips the
# keyword checks; its plan is computed anew. Not kept for a Hugging Face config.
_PREPARED: dict[tuple, tuple] = {}


def clear_cache() -> None:
    _SETUP.clear()
    _PARTS.clear()
    _PREPARED.clear()


def _prepared(command: str, flags: Mapping[str, object]):
    """(the parsed flags, the inputs), checked as the CLI checks them."""
    try:
        key = (command, tuple(flags.items()), tuple(map(type, flags.values())))
        done = _PREPARED.get(key)
    except TypeError:  # an unhashable value (a list)
        key = done = None
    if done is not None:
        return done[0], done[1]
    a, x = _prepare(command, flags)
    if key is not None and not getattr(a, "hf_config", None):
        if len(_PREPARED) >= _SETUP_SIZE:
            _PREPARED.clear()
        _PREPARED[key] = (a, x)
    return a, x


def _prepare(command: str, flags: Mapping[str, object]):
    from planner.core.options import MODEL_KEYS, build_inputs, inputs_of, model_from, pins_from, setup_from

    spec = _SPECS.get(command)
    if spec is None:
        spec = _SPECS[command] = _Spec(command)
    a, given = spec.namespace(flags)
    values = vars(a)
    pins = spec.pins
    # The setup's key: the values the keywords set, less the pins (the rest are the defaults).
    key = None if values.get("hf_config") else (command, *(i for i in given.items() if i[0] not in pins))
    try:
        setup = _SETUP.get(key) if key is not None else None
    except TypeError:  # an unhashable value (a list): built each time
        key = setup = None
    if setup is None:
        _check_given(spec, given)  # every number in its documented range, as the CLI checks it (defaults: _Spec)
        if key is None:
            return a, build_inputs(values)
        # Its two parts kept apart too: a sweep over models builds the hardware and job once (and
        # what is kept for those objects stays found), a sweep over jobs the model.
        parts = (("model", *(i for i in key[1:] if i[0] in MODEL_KEYS)),
                 (command, *(i for i in key[1:] if i[0] not in MODEL_KEYS)))
        model, rest = _PARTS.get(parts[0]), _PARTS.get(parts[1])
        if model is None:
            model = model_from(values)
        if rest is None:
            rest = setup_from(values)
        x = inputs_of(model, rest, values)
        if len(_SETUP) >= _SETUP_SIZE:
            _SETUP.clear()
        if len(_PARTS) >= 2 * _SETUP_SIZE:
            _PARTS.clear()
        _SETUP[key] = x
        _PARTS[parts[0]], _PARTS[parts[1]] = model, rest
        return a, x
    _check_given(spec, {name: v for name, v in given.items() if name in pins})  # the rest was checked with the setup
    import dataclasses

    return a, dataclasses.replace(setup, pins=pins_from(values))


def _check_given(spec: _Spec, given: dict[str, object]) -> None:
    """``check_flags`` of the values the keywords set; when one is refused, the first refused in
    the parser's order is named, as the CLI names it whatever order the keywords came in."""
    from planner.core.limits import check_flags

    try:
        check_flags(given)
    except PlannerError:
        check_flags({name: given[name] for name in spec.defaults if name in given})
        raise


def estimate(**flags: object) -> dict:
    """`planner estimate --format json` as a dict. Keywords: the flags of `planner estimate`."""
    return estimate_of(flags)


def estimate_of(flags: Mapping[str, object]) -> dict:
    """``estimate`` of the flags as a mapping (``planner.estimate`` passes its keywords' dict on)."""
    x, p = _estimate_plan()(*_prepared("estimate", flags))
    return p.to_json(x.model_note)


@functools.cache
def _estimate_plan():
    from planner.cli.main import estimate_plan

    return estimate_plan


def search(**flags: object) -> dict:
    """`planner search --format json` as a dict: ``evaluated``, ``feasible``, ``search_seconds`` and
    ``results`` (the listed layouts in rank order: ``top`` of them, 20 by default, 0 for every one
    that fits; ``all=True`` lists those that do not fit too). Keywords: the flags of `planner search`."""
    from planner.cli.main import search_head, search_listing

    _, r, rows = search_listing(*_prepared("search", flags))
    return {**search_head(r), "results": [e.to_json() for e in rows]}


def keywords(command: str = "estimate") -> list[str]:
    """Every keyword ``planner.estimate`` (or ``planner.search``) accepts."""
    spec = _SPECS.get(command) or _SPECS.setdefault(command, _Spec(command))
    return sorted(spec.keys)
