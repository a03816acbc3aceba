"""One small registry for everything CMBench looks up by name: methods, scorer stages, commands.

A :class:`Registry` maps names to objects (classes, callables). Entries come from

- a decorator or :meth:`Registry.add` in CMBench's own modules;
- lazy ``"package.module:attr"`` strings, imported on first use (commands stay cheap to list);
- an entry-point group (``[project.entry-points."cmbench.methods"]`` in a plug-in's pyproject), so an
  installed package adds names without editing CMBench.

Lookups of unknown names fail with a :class:`~cmbench.errors.ConfigError` that suggests the closest
name; a ``base`` class, when given, is checked on every object the registry hands out. Configs that
name a class by import path (Hydra's ``_target_``) go through :meth:`Registry.import_target` (a
subclass of ``base``) or :func:`import_factory` (a class or annotated loader of the expected kind): what
a target makes is checked before anything calls it, so ``_target_: os.system`` runs nothing.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from cmbench.errors import ConfigError

T = TypeVar("T")


def did_you_mean(word: str, options) -> str:
    """`` Did you mean 'x'?`` for the closest of ``options``, or an empty string."""
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def import_object(target: str, what: str = "_target_") -> Any:
    """Import ``package.module.attr``, ``package.module:attr`` or a module (attributes may be nested:
    ``Class.method``).

    Raises
    ------
    ConfigError
        The path is malformed or nothing importable is there.
    """
    text = str(target)
    module_name, sep, attr = text.partition(":")
    if not sep:
        parts = text.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module prefix
            try:
                importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            module_name, attr = ".".join(parts[:cut]), ".".join(parts[cut:])
            break
        else:
            raise ConfigError(f"cannot import {what} {text!r}: no importable module in it (expected 'package.module.Name')")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in filter(None, attr.split(".")):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"cannot import {what} {text!r}: {err}") from err
    return obj


def produced_class(obj: Any) -> type | None:
    """The class ``obj`` makes when called: ``obj`` itself when it is a class, else the declared return
    type of a function or method (``def load(...) -> MyBackbone``, a classmethod ``from_pretrained``);
    None for anything else (a builtin such as ``os.system``, an unannotated function)."""
    if isinstance(obj, type):
        return obj
    if not (inspect.isfunction(obj) or inspect.ismethod(obj)):
        return None
    returned = inspect.get_annotations(getattr(obj, "__func__", obj)).get("return")
    owner = getattr(obj, "__self__", None)
    scope = {**vars(sys.modules[obj.__module__]), **({owner.__name__: owner} if isinstance(owner, type) else {})}
    for _ in range(2):  # postponed annotations, quoted once more (``-> "Model"``): resolve where the function lives
        if not isinstance(returned, str):
            break
        try:
            returned = eval(returned, scope)  # noqa: S307 - an annotation of code the config already trusts
        except Exception:
            return None
    return returned if isinstance(returned, type) else None


def import_factory(target: str, accepts: Callable[[type], bool], kind: str, what: str = "_target_") -> Any:
    """Import a ``_target_`` that will be called, and check what it makes BEFORE anything calls it.

    Parameters
    ----------
    target : str
        The import path.
    accepts : callable
        ``class -> bool``: whether instances of the class are of the expected kind.
    kind : str
        What the target must make ("Backbone"), for the message.
    what : str
        What names the target, for the message.

    Raises
    ------
    ConfigError
        Not importable, or not a class of that kind nor a function annotated to return one.
    """
    obj = import_object(target, what)
    made = produced_class(obj)
    if made is None or not accepts(made):
        got = "nothing it declares" if made is None else made.__qualname__
        raise ConfigError(f"{what} {target!r} is not a {kind} class nor a function annotated to return one "
                          f"(it makes {got}); refused without calling it")
    return obj


class Registry(Generic[T]):
    """Named objects of one kind.

    Parameters
    ----------
    kind : str
        What the entries are, for messages ("method", "detector backend", "command").
    base : type, optional
        Every object handed out must be this class or a subclass of it.
    entry_point_group : str, optional
        Installed packages' entry points of this group are entries too (built-ins win on a clash).
    """

    def __init__(self, kind: str, base: type | None = None, entry_point_group: str | None = None) -> None:
        self.kind = kind
        self.base = base
        self.entry_point_group = entry_point_group
        self._entries: dict[str, T | str] = {}

    # ------------------------------------------------------------------ filling
    def add(self, name: str, obj: T | str) -> None:
        """Register ``obj`` (or a lazy ``"module:attr"`` string) as ``name``; a name is taken once."""
        if not name:
            raise ValueError(f"a {self.kind} needs a non-empty name")
        if name in self._entries and self._entries[name] is not obj:
            raise ValueError(f"{self.kind} name {name!r} is already taken by {self._entries[name]!r}")
        self._entries[name] = obj

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Class decorator: register under ``name``, or the class's own ``name`` attribute."""

        def decorate(obj: T) -> T:
            self.add(name or str(getattr(obj, "name", "")), self._checked(obj, "registered object"))
            return obj

        return decorate

    # ------------------------------------------------------------------ lookups
    def _entry_points(self) -> dict[str, Any]:
        if not self.entry_point_group:
            return {}
        return {ep.name: ep for ep in entry_points(group=self.entry_point_group)}

    def names(self) -> list[str]:
        """Registered names (built-ins and entry points), sorted."""
        return sorted(set(self._entries) | set(self._entry_points()))

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._entry_points()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> T:
        """The object registered as ``name`` (lazy strings and entry points imported now)."""
        if name in self._entries:
            entry = self._entries[name]
            if isinstance(entry, str):
                entry = self._checked(import_object(entry, f"{self.kind} {name!r}"), f"{self.kind} {name!r}")
                self._entries[name] = entry
            return entry
        eps = self._entry_points()
        if name in eps:
            return self._checked(eps[name].load(), f"entry point {name!r} ({self.entry_point_group})")
        raise ConfigError(f"unknown {self.kind} {name!r}.{did_you_mean(name, self.names())} "
                          f"Known: {', '.join(self.names())}")

    def import_target(self, target: str) -> T:
        """Import a ``_target_`` path and check it against ``base``."""
        return self._checked(import_object(target), f"_target_ {target!r}")

    def _checked(self, obj: Any, where: str) -> Any:
        if self.base is not None and not (isinstance(obj, type) and issubclass(obj, self.base)):
            raise ConfigError(f"{where} is not a subclass of {self.base.__module__}.{self.base.__qualname__}")
        return obj
