"""Plug-ins: methods, heads, backbones and data sets from other installed packages.

A package declares each as a Python entry point in the group fewshot.methods, fewshot.heads,
fewshot.backbones or fewshot.datasets (the registries' modules say what an entry point of theirs
must name). A registry reads its group once, the first time it is asked for a name it does not
hold, loads only the entry point of that name and registers what it names after checking its
kind. A plug-in never replaces a built-in: one that takes a built-in's
name, two that take one name, one that fails to import or names the wrong kind of object are
refused in one line naming the entry point and its package.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterator
from importlib.metadata import EntryPoint, entry_points

from fewshot.runtime.errors import FewshotError, summary


def origin(point: EntryPoint) -> str:
    """An entry point as messages name it: its line of pyproject.toml and its package."""
    dist = point.dist
    package = f"package {dist.name} {dist.version}" if dist is not None else "an unknown package"
    return f"entry point '{point.name} = {point.value}' of {package}"


def described(plugin: object) -> str:
    """What an entry point named, as a refusal says: a callable's name and signature, else
    the object's type."""
    try:
        return f"{plugin.__qualname__}{inspect.signature(plugin)}"
    except (AttributeError, TypeError, ValueError):  # no name or no signature
        return f"an object of type {type(plugin).__name__}"


def require_signature(plugin: object, kind: str, *args: object, **kwargs: object) -> None:
    """Refuse (TypeError) a plug-in that cannot be called with `args` and `kwargs` alone,
    naming the `kind` of callable it should be: its options must have defaults (an option
    without one would fail a run that does not give it, in its own code)."""
    try:
        inspect.signature(plugin).bind(*args, **kwargs)
    except (TypeError, ValueError):  # not callable, no signature, or one that does not bind
        raise TypeError(f"must name {kind}, not {described(plugin)}") from None


class RegistryNames:
    """The names a registry answers to: `name in names` is true for a name it holds or a
    plug-in of its entry-point group (read then, loaded, checked and registered by `adopt`);
    iterating gives the names held (built-ins, then the plug-ins registered so far), the
    `extra` ones and, once the group was read, its other plug-ins' names, without reading it
    (--help lists them). No plug-in may take any of the first two kinds of names or those
    `taken` (a registry's names in another role)."""

    def __init__(
        self,
        group: str,
        kind: str,
        held: Collection[str],
        adopt: Callable[[str, object], None],
        *,
        extra: Collection[str] = (),
        taken: Collection[str] = (),
    ):
        self.group, self.kind, self.held, self.adopt = group, kind, held, adopt
        self.extra, self.taken = tuple(extra), taken
        self._points: dict[str, EntryPoint] | None = None

    def __iter__(self) -> Iterator[str]:
        declared = [name for name in self._points or {} if name not in self.held]
        return iter([*self.held, *self.extra, *declared])

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.find(name)

    def find(self, name: str) -> bool:
        """Whether the registry holds `name` or a plug-in takes it (loaded and registered
        now); FewshotError when that plug-in or its group is refused."""
        if name in self.held or name in self.extra:
            return True
        point = self._plugins().get(name)
        if point is None:
            return False
        try:
            plugin = point.load()
        except Exception as e:  # a plug-in's import runs its package's code: anything
            raise FewshotError(
                f"plug-in {self.kind} {name!r} ({origin(point)}) failed to import: "
                f"{type(e).__name__}: {summary(e)}"
            ) from None
        try:
            self.adopt(name, plugin)
        except TypeError as e:
            raise FewshotError(f"plug-in {self.kind} {name!r} ({origin(point)}) {e}") from None
        return True

    def _plugins(self) -> dict[str, EntryPoint]:
        """The group's entry points by name, read and checked once: none may take a name the
        registry holds (its built-ins, when first read) or that another takes."""
        if self._points is None:
            points: dict[str, EntryPoint] = {}
            for point in entry_points(group=self.group):
                if any(point.name in names for names in (self.held, self.extra, self.taken)):
                    raise FewshotError(
                        f"plug-in {self.kind} {point.name!r} ({origin(point)}) takes a built-in "
                        f"{self.kind}'s name, which no plug-in replaces: rename it, or uninstall "
                        "its package"
                    )
                if point.name in points:
                    raise FewshotError(
                        f"plug-in {self.kind} {point.name!r} is declared twice, by "
                        f"{origin(points[point.name])} and by {origin(point)}: uninstall one"
                    )
                points[point.name] = point
            self._points = points
        return self._points
