"""planner.memo: each helper gives what the plain Python it stands for gives (no timing here)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from planner import memo


def test_by_identity_keeps_answers_per_object_and_recomputes_for_an_equal_one():
    calls = []

    @memo.by_identity
    def f(a, b):
        calls.append((a, b))
        return [a, b]  # a new object each time it is computed

    x, y = ("x",) * 2, [1]
    first = f(x, y)
    assert f(x, y) is first and len(calls) == 1  # the same objects: kept
    other = [1]  # equal to y, another object: computed again, to an equal answer
    assert f(x, other) == first and f(x, other) is not first and len(calls) == 2
    f.cache_clear()
    assert f(x, y) is not first and len(calls) == 3


def test_by_identity_of_one_argument_and_its_limits():
    @memo.by_identity
    def g(a):
        return object()

    a = object()
    assert g(a) is g(a)
    kept = [g(object()) for _ in range(memo.SIZE + 5)]  # more than it keeps: it starts again, still right
    assert len(set(map(id, kept))) == len(kept)
    with pytest.raises(TypeError, match="without defaults"):
        memo.by_identity(lambda a, b=1: a)


def test_by_identity_clears_the_lru_cache_under_it_too():
    import functools

    @memo.by_identity
    @functools.lru_cache(maxsize=8)
    def h(a):
        return object()

    a = object()
    before = h(a)
    h.cache_clear()
    assert h.__wrapped__.cache_info().currsize == 0 and h(a) is not before


@dataclass(frozen=True)
class _Plain:
    a: int
    b: tuple = ()


def test_kept_hash_is_the_dataclass_hash_of_its_fields():
    @dataclass(frozen=True, slots=True)
    class Kept:
        a: int
        b: tuple = ()

        def __hash__(self) -> int:
            return memo.kept_hash(self)

    for a, b in [(1, ()), (2, ("x", 3)), (-5, (1.5,))]:
        assert hash(Kept(a, b)) == hash((a, b)) == hash(Kept(a, b))
        assert Kept(a, b) == Kept(a, b)
    assert {Kept(1, ()): "one"}[Kept(1, ())] == "one"  # equal objects find each other

    @dataclass(frozen=True, slots=True)
    class One:  # one compared field: a tuple of one, as the dataclass hashes it
        a: int
        note: str = dataclasses.field(default="", compare=False)

        def __hash__(self) -> int:
            return memo.kept_hash(self)

    @dataclass(frozen=True, slots=True)
    class NoField:
        def __hash__(self) -> int:
            return memo.kept_hash(self)

    assert hash(One(7, "x")) == hash((7,)) == hash(One(7, "y")) and hash(NoField()) == hash(())
    # The planner's own: a model and a job, by every field they compare
    from planner.core.layout import Job
    from planner.core.presets import get_preset

    for obj in (get_preset("deepseek-v3"), get_preset("llama3-8b"), Job(), Job(precision="fp8", mode="lora")):
        fields = tuple(getattr(obj, f.name) for f in dataclasses.fields(obj) if f.compare)
        assert hash(obj) == hash(fields)


def _pair(cls_kwargs: dict, body: dict):
    """The same dataclass twice: as the dataclass module makes it, and with ``fast_init``."""
    def make(fast: bool):
        ns = {"__annotations__": dict(body["__annotations__"]),
              **{k: (dataclasses.field(**v) if isinstance(v, dict) else v) for k, v in body.items()
                 if k != "__annotations__"}}
        cls = dataclass(frozen=True, slots=True, **cls_kwargs)(type("C", (), ns))
        return memo.fast_init(cls) if fast else cls
    return make(False), make(True)


@pytest.mark.parametrize("kw_only", [False, True])
def test_fast_init_builds_the_same_object(kw_only):
    posts = []
    body = {"__annotations__": {"a": int, "b": float, "c": list, "d": list},
            "b": 2.5, "c": {"default_factory": list}, "d": {"default_factory": list, "init": False, "compare": False},
            "__post_init__": lambda self: posts.append(self.a)}
    plain, fast = _pair({"kw_only": kw_only}, body)
    import inspect

    assert str(inspect.signature(fast)) == str(inspect.signature(plain))  # annotations and defaults shown alike
    for kwargs in ({"a": 1}, {"a": 1, "b": 3.0}, {"a": 2, "c": [7]}):
        x, y = plain(**kwargs), fast(**kwargs)
        assert (x.a, x.b, x.c, x.d) == (y.a, y.b, y.c, y.d) and repr(x)[1:] == repr(y)[1:]
        assert posts[-2:] == [kwargs["a"]] * 2  # __post_init__ ran once for each
        assert y.d is not fast(**kwargs).d and ("c" in kwargs or y.c is not fast(**kwargs).c)  # a new list each
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast(a=1).a = 2
    with pytest.raises(TypeError):
        fast(a=1, e=2)
    if kw_only:
        with pytest.raises(TypeError):
            fast(1)
    else:
        assert fast(1, 4.0).b == 4.0
    with pytest.raises(TypeError):
        memo.fast_init(_Plain)  # not slotted


@pytest.mark.parametrize("kw_only", [False, True])
def test_replace_is_dataclasses_replace(kw_only):
    """memo.replace on a fast_init class (its fields read in one display), on a plain dataclass and
    on a fast_init class with a field outside __init__ (dataclasses.replace's path), against
    dataclasses.replace: the same fields, __post_init__ run again, an unknown field and a field
    outside __init__ refused alike; a field named ``obj`` taken like any other."""
    posts = []
    body = {"__annotations__": {"a": int, "b": float, "c": list}, "b": 2.5, "c": {"default_factory": list},
            "__post_init__": lambda self: posts.append(self.a)}
    plain, fast = _pair({"kw_only": kw_only}, body)
    assert "_replaced" in vars(fast) and "_replaced" not in vars(plain)
    for cls in (plain, fast):
        x = cls(a=1, b=3.0, c=[5])
        for changes in ({}, {"a": 2}, {"b": 4.0, "c": [6]}):
            posts.clear()
            y, z = memo.replace(x, **changes), dataclasses.replace(x, **changes)
            assert type(y) is cls and (y.a, y.b, y.c) == (z.a, z.b, z.c) and posts == [y.a, z.a]
            assert y.c is x.c or "c" in changes  # fields are not copied, as dataclasses.replace
        with pytest.raises(TypeError):
            memo.replace(x, e=1)
    with_unset = dict(body, d={"default_factory": list, "init": False})
    with_unset["__annotations__"] = {**body["__annotations__"], "d": list}
    _, fast_unset = _pair({"kw_only": kw_only}, with_unset)
    assert "_replaced" not in vars(fast_unset)  # a field outside __init__: dataclasses.replace's own rules
    with pytest.raises(ValueError):
        memo.replace(fast_unset(a=1), d=[])
    _, named_obj = _pair({"kw_only": kw_only}, {"__annotations__": {"obj": int}})
    assert memo.replace(named_obj(obj=1), obj=2).obj == 2 == dataclasses.replace(named_obj(obj=1), obj=2).obj


def test_fast_init_refuses_an_initvar():
    @dataclass(frozen=True, slots=True)
    class V:
        a: int
        b: dataclasses.InitVar[int]

        def __post_init__(self, b):
            pass

    with pytest.raises(TypeError, match="InitVar"):
        memo.fast_init(V)


def test_dict_of_slots_and_slot_filler_are_the_loops_they_write_out():
    @dataclass(frozen=True, slots=True)
    class P:
        x: int
        y: str
        z: float

    p = P(1, "two", 3.0)
    assert memo.dict_of_slots(P)(p) == {name: getattr(p, name) for name in P.__slots__} == {"x": 1, "y": "two", "z": 3.0}
    q = object.__new__(P)
    memo.slot_filler(P, ("x", "y", "z"))(q, {"x": 4, "y": "five", "z": 6.0, "unused": 0})
    assert q == P(4, "five", 6.0)
    with pytest.raises(KeyError):
        memo.slot_filler(P, ("x",))(object.__new__(P), {})


def test_kept_property_is_the_property():
    class M:
        def __init__(self, n):
            self.n, self.reads = n, 0

        @memo.kept_property
        def twice(self):
            self.reads += 1
            return 2 * self.n

    m = M(4)
    assert (m.twice, m.twice, m.reads) == (8, 8, 1)
    assert M(5).twice == 10


def test_clear_all_empties_every_identity_cache():
    @memo.by_identity
    def f(a):
        return object()

    a = object()
    before = f(a)
    memo.clear_all()
    assert f(a) is not before


def test_with_factors_is_with_efficiency_of_the_replaced_factors():
    """``HardwareProfile.with_factors`` (only the factors changed compared) against the plain
    ``with_efficiency(dataclasses.replace(efficiency, **changes))`` it stands for: the same
    profile, the same factors counted as set by it; with nothing changed, the profile itself."""
    from planner.hardware import get_profile

    for name in ("h100", "a100-80g", "cpu-2core"):
        hw = get_profile(name)
        e = hw.efficiency
        for changes in ({}, {"tp_overlap": e.tp_overlap}, {"tp_overlap": 0.25, "dp_overlap": e.dp_overlap},
                        {"layer_overhead_s": 1e-4, "step_overhead_s": 0.0, "dp_overlap": 0.5}):
            plain = hw.with_efficiency(dataclasses.replace(e, **changes))
            fast = hw.with_factors(changes)
            assert fast == plain and fast.efficiency_keys == plain.efficiency_keys, (name, changes)
        assert hw.with_factors({"tp_overlap": e.tp_overlap}) is hw


def test_async_tp_overlaps_more_is_the_comparison_of_the_two_effective_profiles():
    """``planner.stacks.async_tp_overlaps_more`` (read from the stack and what the profile sets)
    against comparing ``effective(hw, stack, True)`` with ``effective(hw, stack, False)``, on every
    stack, a datasheet and a calibrated profile (its file sets tp_overlap), with and without the
    overlap set for the plan (--set), which wins over the profile's own value."""
    from planner.hardware import get_profile
    from planner.stacks import async_tp_overlaps_more, effective, get_stack, stack_names, with_overrides

    seen = set()
    for name in stack_names():
        for hw in (get_profile("h100"), get_profile("cpu-2core")):
            for items in ((), ("overlap.tp_overlap=0.1",), ("overlap.tp_overlap_async=0.9",)):
                stack = with_overrides(get_stack(name), items) if items else get_stack(name)
                on, off = effective(hw, stack, True), effective(hw, stack, False)
                plain = on.efficiency.tp_overlap > off.efficiency.tp_overlap
                assert async_tp_overlaps_more(hw, stack) == plain, (name, hw.name, items)
                seen.add(plain)
    assert seen == {True, False}  # both answers were checked

