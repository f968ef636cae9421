"""What makes one pinned estimate cheap in Python, for the immutable objects it is made of.

- ``by_identity``: answers kept by the identity of their arguments, for functions of immutable
  objects (a job, a model, a hardware profile, a stack) that an estimate asks again and again with
  the same objects. ``functools.lru_cache`` hashes its arguments on every call: a frozen dataclass
  of thirty fields hashes them all (1-3 us), which is what some of these functions cost. Here the
  key is the arguments' ``id``s; each entry keeps its arguments alive, so an id is not reused
  while its entry lives, and a hit is checked to be the same objects. Small ints, bools, None and
  a stack's strings (the other arguments these take) are the same objects whenever they are equal;
  an equal but distinct object is a miss, computed again (to the same answer). ``kept_property``:
  a property kept so, ``kept_hash``: a frozen dataclass's hash kept so.
- ``fast_init``, ``dict_of_slots``, ``slot_filler``: a frozen slotted dataclass's ``__init__``,
  its fields as a dict, and its fields set from a dict, written out field by field (each one
  attribute load or slot store, not a name looked up on the type per field); ``replace``:
  ``dataclasses.replace``, a ``fast_init`` class's fields read by its ``dict_of_slots``.

None of these changes an answer: tests/test_memo.py checks each against the plain Python it stands
for, and tests/test_search_paths.py the pinned estimate against its row of a table, to the bit.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable

SIZE = 64  # entries kept per function: when full, it starts again empty


def by_identity(f: Callable) -> Callable:
    """``f`` with its answers kept by its arguments' identity (``cache_clear`` empties it, and the
    cache under it, if any). ``f`` takes one to four positional arguments, none with a default."""
    inner = getattr(f, "__wrapped__", f)  # under it, an lru_cache keeping answers by equal arguments
    n = inner.__code__.co_argcount
    if not 1 <= n <= 4 or inner.__defaults__ or inner.__code__.co_kwonlyargcount:
        raise TypeError(f"by_identity: {inner.__name__} takes 1 to 4 positional arguments without defaults")
    args = ", ".join(f"a{i}" for i in range(n))
    key = "id(a0)" if n == 1 else f"({', '.join(f'id(a{i})' for i in range(n))})"
    same = " and ".join(f"hit[{i}] is a{i}" for i in range(n))
    # Written out for its count of arguments: a hit is a dict lookup and n identity checks.
    source = (f"def cached({args}):\n"
              f"    hit = kept.get({key})\n"
              f"    if hit is not None and {same}:\n"
              f"        return hit[{n}]\n"
              f"    if len(kept) >= SIZE:\n"
              f"        kept.clear()\n"
              f"    out = f({args})\n"
              f"    kept[{key}] = ({args}, out)\n"
              f"    return out\n")
    kept: dict = {}
    names = {"kept": kept, "f": f, "SIZE": SIZE}
    exec(source, names)  # noqa: S102 (our own text: a function written out, as dataclasses writes __init__)
    cached = functools.wraps(f)(names["cached"])

    def cache_clear() -> None:
        kept.clear()
        if hasattr(f, "cache_clear"):
            f.cache_clear()

    cached.cache_clear = cache_clear
    _CLEARS.append(cache_clear)
    return cached


_CLEARS: list[Callable[[], None]] = []


def clear_all() -> None:
    """Empty every cache of this module: what ``by_identity`` (and ``kept_property``,
    ``kept_hash``) keep, and the caches under them."""
    for clear in _CLEARS:
        clear()


def dict_of_slots(cls: type) -> Callable:
    """``lambda obj: {name: obj.name for name in cls.__slots__}``, written out as one dict display
    (twice as fast as the comprehension: each field one attribute load)."""
    fields = ", ".join(f"{name!r}: obj.{name}" for name in cls.__slots__)
    names: dict[str, object] = {}
    exec(f"def as_dict(obj):\n    return {{{fields}}}\n", names)  # noqa: S102 (as above)
    return names["as_dict"]


def slot_filler(cls: type, names: tuple[str, ...]) -> Callable:
    """``fill(obj, values)``: each of ``names`` set on ``obj`` (an instance of ``cls``, frozen or
    not) to ``values[name]``, through the slots' descriptors, written out name by name."""
    setters = {f"_set_{i}": getattr(cls, name).__set__ for i, name in enumerate(names)}
    body = "".join(f"    _set_{i}(obj, values[{name!r}])\n" for i, name in enumerate(names))
    exec(f"def fill(obj, values):\n{body or '    pass'}\n", setters)  # noqa: S102 (as above)
    return setters["fill"]


def kept_property(f: Callable) -> property:
    """A property of an immutable object computed once per object (``by_identity``): for those
    that read several others (a model's widths and parameter counts, read dozens of times in an
    estimate)."""
    return property(by_identity(f))


@by_identity
def kept_hash(obj) -> int:
    """A frozen dataclass's hash (of its compared fields, as the dataclass's own), computed once per
    object: a model or job is a key of several caches in every estimate, and hashing its thirty
    fields costs more than most of what those caches keep."""
    return hash(_compared_values(type(obj))(obj))


@functools.cache  # one per class: what its fields are, not any object's values
def _compared_values(cls: type) -> Callable:
    """A function giving an object's compared fields as one tuple (``operator.attrgetter`` of their
    names: 0.6 us for a model's thirty fields, where reading ``dataclasses.fields`` each time and
    a getattr per field took 4.5 us; an estimate with its caches empty hashes about thirty models
    and jobs)."""
    names = tuple(f.name for f in dataclasses.fields(cls) if f.compare)
    if len(names) < 2:  # attrgetter of one name gives the value, not a tuple of one
        return lambda obj: tuple(getattr(obj, name) for name in names)
    return operator.attrgetter(*names)


def fast_init(cls: type) -> type:
    """A frozen, slotted dataclass whose ``__init__`` sets each field through its slot's descriptor
    rather than ``object.__setattr__`` (which looks the name up on the type for every field): the
    same signature, defaults, default factories and ``__post_init__``, the same object, in three
    quarters of the time. Objects an estimate makes by the dozen (its memory, times, evaluation and
    JSON parts) use it."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"fast_init: {cls.__name__} is not a frozen, slotted dataclass")
    if any(f._field_type is dataclasses._FIELD_INITVAR for f in cls.__dataclass_fields__.values()):
        raise TypeError(f"fast_init: {cls.__name__} has an InitVar (its __init__ would not take it)")
    names: dict[str, object] = {"_FACTORY": _FACTORY}
    args, kwonly, body = [], [], []
    for f in dataclasses.fields(cls):
        names[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default_factory is not dataclasses.MISSING:
            names[f"_make_{f.name}"] = f.default_factory
            value = f"_make_{f.name}()"
            if f.init:  # the factory's value when not given (the dataclass's own sentinel rule)
                value = f"_make_{f.name}() if {f.name} is _FACTORY else {f.name}"
                (kwonly if f.kw_only else args).append(f"{f.name}=_FACTORY")
        elif f.default is not dataclasses.MISSING:
            names[f"_default_{f.name}"] = f.default
            value = f.name if f.init else f"_default_{f.name}"
            if f.init:
                (kwonly if f.kw_only else args).append(f"{f.name}=_default_{f.name}")
        elif f.init:
            value = f.name
            (kwonly if f.kw_only else args).append(f.name)
        else:  # no init, no default: left unset, as the dataclass leaves it
            continue
        body.append(f"    _set_{f.name}(self, {value})")
    signature = ", ".join(["self", *args, *(["*", *kwonly] if kwonly else [])])
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    exec(f"def __init__({signature}):\n" + "\n".join(body or ["    pass"]), names)  # noqa: S102 (as above)
    init = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)  # the dataclass's: inspect.signature shows them
    cls.__init__ = init
    if all(f.init for f in dataclasses.fields(cls)):  # (a field set in __post_init__: dataclasses.replace)
        fields_of = dict_of_slots(cls)  # a slotted dataclass's slots are its fields
        cls._replaced = staticmethod(lambda obj, changes: cls(**{**fields_of(obj), **changes}))
    return cls


def replace(obj, /, **changes):
    """``dataclasses.replace(obj, **changes)``: for a ``fast_init`` class, its fields read by its
    ``dict_of_slots`` (dataclasses.replace reads each field's definition for every call: 4-6 us for a
    profile's thirty factors, which an estimate with its caches empty replaces twice)."""
    replaced = type(obj).__dict__.get("_replaced")  # the class's own (a subclass's fields differ)
    return dataclasses.replace(obj, **changes) if replaced is None else replaced(obj, changes)


class _Factory:
    def __repr__(self) -> str:
        return "<factory>"  # as the dataclass's own signature shows it


_FACTORY = _Factory()  # "not given" for a field with a default factory
