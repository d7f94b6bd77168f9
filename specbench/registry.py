"""Name -> component registries.

Every swappable part (drafters, tree policies, verifiers, targets, datasets) lives in a `Registry`.
Entries are either registered eagerly with the `register` decorator or lazily as a "module:attr"
string, so that listing names never imports torch-heavy modules. A name that is not registered but
looks like a dotted path ("my_pkg.my_mod:MyDrafter" or "my_pkg.my_mod.MyDrafter") is imported as an
out-of-tree component: researchers can plug their own class in without touching specbench.
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

    def __init__(self, kind: str, plural: str | None = None) -> None:
        self.kind = kind
        self.plural = plural or f"{kind}s"
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
                obj = import_dotted(entry)
                self._entries[name] = obj
                return obj
            return entry
        if "." in name or ":" in name:
            try:
                return import_dotted(name)
            except (ImportError, AttributeError) as exc:
                raise RegistryError(
                    f"{self.kind} {name!r} is neither registered nor importable ({exc}). "
                    f"Registered {self.plural}: {', '.join(self.names())}"
                ) from None
        raise RegistryError(
            f"unknown {self.kind} {name!r}. Registered {self.plural}: {', '.join(self.names())} "
            f"(or give an importable 'package.module:Class')"
        )

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


def _lazy_matches(path: str, obj: Any) -> bool:
    module_name, _, attr = path.partition(":")
    return getattr(obj, "__module__", None) == module_name and getattr(obj, "__qualname__", None) == attr
