"""Name -> component registries.

Every swappable part (drafters, tree policies, verifiers, targets, datasets) lives in a `Registry`.
Entries are either registered eagerly with the `register` decorator or lazily as a "module:attr"
string, so that listing names never imports torch-heavy modules. A name that is not registered but
looks like a dotted path ("my_pkg.my_mod:MyDrafter" or "my_pkg.my_mod.MyDrafter") is imported as an
out-of-tree component: researchers can plug their own class in without touching specbench.

A registry may name the base class of its kind (`base="module:Class"`): `get` then refuses anything
else, so a dotted path to the wrong class fails at once. The bases state their contracts as class
attributes without defaults, and `require_declared` (called from their `__init_subclass__`) makes a
subclass that omits one fail when it is defined, with a message that says what to add.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """Unknown or duplicate registry name. `str()` gives the whole message (KeyError quotes it)."""

    def __str__(self) -> str:  # KeyError.__str__ would repr() the message
        return str(self.args[0]) if self.args else ""


def import_dotted(path: str) -> Any:
    """Import "pkg.mod:attr" or "pkg.mod.attr"."""
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ImportError(f"{path!r} is not a dotted path of the form 'package.module:Name'")
    module = importlib.import_module(module_name)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """A named collection of components of one kind (e.g. "drafter")."""

    def __init__(self, kind: str, plural: str | None = None, base: str | None = None) -> None:
        self.kind = kind
        self.plural = plural or f"{kind}s"
        self.base = base  # "module:Class" every entry must subclass (resolved on first use)
        self._entries: dict[str, T | str] = {}

    def register(self, name: str, obj: T | str | None = None) -> Any:
        """Register `obj` under `name`; used bare as a decorator when `obj` is omitted.

        `obj` may be a "module:attr" string: it is imported on first `get`.
        """
        if obj is not None:
            self._add(name, obj)
            return obj

        def decorator(target: T) -> T:
            self._add(name, target)
            return target

        return decorator

    def _add(self, name: str, obj: T | str) -> None:
        existing = self._entries.get(name)
        if existing is not None:
            # A lazy entry being resolved to the object it names is not a duplicate.
            if isinstance(existing, str) and not isinstance(obj, str) and _lazy_matches(existing, obj):
                self._entries[name] = obj
                return
            if existing is obj:
                return
            raise RegistryError(f"{self.kind} {name!r} is registered twice; pick another name")
        self._entries[name] = obj

    def get(self, name: str) -> T:
        if name in self._entries:
            entry = self._entries[name]
            if isinstance(entry, str):
                obj = self._checked(name, import_dotted(entry))
                self._entries[name] = obj
                return obj
            return self._checked(name, entry)
        if "." in name or ":" in name:
            try:
                obj = import_dotted(name)
            except (ImportError, AttributeError) as exc:
                raise RegistryError(
                    f"{self.kind} {name!r} is neither registered nor importable ({exc}). "
                    f"Registered {self.plural}: {', '.join(self.names())}"
                ) from None
            return self._checked(name, obj)
        raise RegistryError(
            f"unknown {self.kind} {name!r}. Registered {self.plural}: {', '.join(self.names())} "
            f"(or give an importable 'package.module:Class')"
        )

    def _checked(self, name: str, obj: Any) -> Any:
        if self.base is not None:
            base = import_dotted(self.base)
            if not (isinstance(obj, type) and issubclass(obj, base)):
                raise RegistryError(f"{self.kind} {name!r} is {obj!r}, not a subclass of {self.base.replace(':', '.')}: "
                                    f"derive it from that class")
        return obj

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def build(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """`get(name)(*args, **kwargs)` with the name attached to errors from the constructor."""
        factory: Callable[..., Any] = self.get(name)  # type: ignore[assignment]
        try:
            return factory(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"cannot build {self.kind} {name!r}: {exc}") from exc


def require_declared(cls: type, base: type, hints: dict[str, str]) -> None:
    """TypeError unless `cls` or a class between it and `base` sets every attribute named in `hints`
    (attribute -> what to write). Abstract classes (intermediate bases) are exempt: their concrete
    subclasses are checked when they are defined."""
    if _is_abstract(cls):
        return
    below = cls.__mro__[: cls.__mro__.index(base)]
    missing = [name for name in hints if not any(name in k.__dict__ for k in below)]
    if missing:
        raise TypeError(f"{base.__name__} subclass {cls.__module__}.{cls.__qualname__} must declare "
                        + "; and ".join(hints[name] for name in missing))


def _is_abstract(cls: type) -> bool:
    """Some method is still abstract (ABCMeta sets __abstractmethods__ only after __init_subclass__)."""
    return any(getattr(getattr(cls, name, None), "__isabstractmethod__", False) for name in dir(cls))


def _lazy_matches(path: str, obj: Any) -> bool:
    module_name, _, attr = path.partition(":")
    return getattr(obj, "__module__", None) == module_name and getattr(obj, "__qualname__", None) == attr
