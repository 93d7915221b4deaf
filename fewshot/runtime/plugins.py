"""Plug-ins: methods, heads, backbones and data sets from other installed packages.

A package declares each as a Python entry point in the group fewshot.methods, fewshot.heads,
fewshot.backbones or fewshot.datasets (the registries' modules say what an entry point of theirs
must name). A registry reads its group once, the first time it is asked for a name it does not
hold, loads only the entry point of that name and registers what it names after checking its
kind. A plug-in never replaces a built-in: one that takes a built-in's
name, two that take one name, one that fails to import (or exits there) or names the wrong kind
of object are refused in one line naming the entry point and its package. A checkpoint records
the plug-ins its run named (`RegistryNames.provenance`), and one trained with a plug-in that is
not installed is refused naming its package (`check_installed`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterator
from importlib.metadata import EntryPoint, entry_points

from fewshot.runtime.errors import FewshotError, summary

# Every registry of plug-ins by its entry-point group, which a checkpoint's record names.
REGISTRIES: dict[str, RegistryNames] = {}
# What a checkpoint records of each plug-in it needs.
RECORD_KEYS = ("group", "name", "package", "version")


def package_text(name: str | None, version: str | None) -> str:
    """A package as messages name it: 'package NAME VERSION' (None: an unknown one)."""
    return f"package {name} {version}" if name is not None else "an unknown package"


def distribution(point: EntryPoint) -> tuple[str | None, str | None]:
    """The name and version of the package that declares an entry point (None: unknown)."""
    dist = point.dist
    return (dist.name, dist.version) if dist is not None else (None, None)


def package_of(point: EntryPoint) -> str:
    """The package of an entry point as messages name it (`package_text`)."""
    return package_text(*distribution(point))


def origin(point: EntryPoint) -> str:
    """An entry point as messages name it: its line of pyproject.toml and its package."""
    return f"entry point '{point.name} = {point.value}' of {package_of(point)}"


def import_failure(error: BaseException) -> str:
    """Why a plug-in's import failed, for its refusal: the exception, or the exit it asked for."""
    if isinstance(error, SystemExit):
        return f"exited when imported (sys.exit({error.code!r}))"
    return f"failed to import: {type(error).__name__}: {summary(error)}"


def described(plugin: object) -> str:
    """What an entry point named (or a plug-in returned), as a refusal says: a callable's name
    and signature, else the object's type (or None)."""
    if plugin is None:
        return "None"
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
        self._loaded: dict[str, EntryPoint] = {}  # the plug-ins registered, by name
        REGISTRIES[group] = self

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
        label = self._plugin_label(point)
        try:
            plugin = point.load()
        # A plug-in's import runs its package's code: anything, sys.exit too (a silent exit).
        except (Exception, SystemExit) as e:
            raise FewshotError(f"{label} {import_failure(e)}") from None
        try:
            self.adopt(name, plugin)
        except TypeError as e:
            raise FewshotError(f"{label} {e}") from None
        self._loaded[name] = point
        return True

    def plugin(self, name: str) -> EntryPoint | None:
        """The entry point whose plug-in was registered as `name` (None: not a plug-in's)."""
        return self._loaded.get(name)

    def label(self, name: str) -> str:
        """How refusals name `name`: a plug-in with its entry point and package."""
        point = self._loaded.get(name)
        return f"{self.kind} {name!r}" if point is None else self._plugin_label(point)

    def _plugin_label(self, point: EntryPoint) -> str:
        """How refusals name the plug-in of an entry point: its kind, name, line and package."""
        return f"plug-in {self.kind} {point.name!r} ({origin(point)})"

    def provenance(self, name: str | None) -> dict[str, str | None] | None:
        """What a checkpoint records of the plug-in registered as `name` (RECORD_KEYS: its
        group, name, package and version); None when `name` is not a plug-in's."""
        point = self._loaded.get(name)
        if point is None:
            return None
        package, version = distribution(point)
        return {"group": self.group, "name": name, "package": package, "version": version}

    def _plugins(self) -> dict[str, EntryPoint]:
        """The group's entry points by name, read and checked once: none may take a name the
        registry holds (its built-ins, when first read) or that another takes."""
        if self._points is None:
            points: dict[str, EntryPoint] = {}
            for point in entry_points(group=self.group):
                if any(point.name in names for names in (self.held, self.extra, self.taken)):
                    raise FewshotError(
                        f"{self._plugin_label(point)} takes a built-in {self.kind}'s name, which "
                        "no plug-in replaces: rename it, or uninstall its package"
                    )
                if point.name in points:
                    raise FewshotError(
                        f"plug-in {self.kind} {point.name!r} is declared twice, by "
                        f"{origin(points[point.name])} and by {origin(point)}: uninstall one"
                    )
                points[point.name] = point
            self._points = points
        return self._points


def check_installed(record: object, where: str) -> None:
    """Refuse a checkpoint (`where` names it) trained with a plug-in that is not installed
    here, or that another package's plug-in of its name stands for, naming the package to
    install; its record of plug-ins (a list of `provenance`'s) is checked first. A checkpoint
    written before they were recorded (no record) is left to the settings' own checks."""
    if record is None:
        return
    entries = record if isinstance(record, list) else [record]
    for entry in entries:
        if not (
            isinstance(entry, dict)
            and set(entry) == set(RECORD_KEYS)
            and entry["group"] in REGISTRIES
            and isinstance(entry["name"], str)
            and all(entry[k] is None or isinstance(entry[k], str) for k in ("package", "version"))
        ):
            raise FewshotError(f"{where} has a damaged record of its plug-ins: {entry!r:.200}")
        names, name = REGISTRIES[entry["group"]], entry["name"]
        package = package_text(entry["package"], entry["version"])
        trained = f"{where} was trained with the {names.kind} {name!r} of {package}"
        if name not in names:  # loads and registers it where it is installed
            raise FewshotError(f"{trained}, which is not installed here: install it")
        here = names.provenance(name)
        if here is not None and here["package"] != entry["package"]:
            raise FewshotError(
                f"{trained}; here {name!r} is the plug-in of {package_of(names.plugin(name))}: "
                f"install {entry['package'] or 'its package'} in its place"
            )
