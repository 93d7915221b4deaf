"""Settings dataclasses: every field typed and range-checked when built, from flags or JSON.

A command's settings are a dataclass whose fields are declared with `setting(...)`. The same
declaration gives the command-line flag (with its help and default), the JSON key, and the
check run in `__post_init__` (through `check_fields`), so a bad value is refused before any
data is read, whatever its source. `build` layers sources (defaults <- checkpoint <- config
file <- flags) and names the flag or the file and key at fault.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import math
import types
import typing
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from fewshot.runtime.errors import FewshotError

T = TypeVar("T")
SEED_MAX = 2**63 - 1  # torch generators take 64-bit seeds; the trainer adds small offsets


class SettingError(FewshotError):
    """A bad value for one field; `build` rewrites it to name the flag or file it came from."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key} {problem}")
        self.key, self.problem = key, problem


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    low: float | None = None,
    above: float | None = None,
    high: float | None = None,
    below: float | None = None,
    choices: Sequence[str] | Callable[[], Collection[str]] | None = None,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    flag: bool = True,
    positional: bool = False,
) -> Any:
    """A dataclass field with its help text and allowed range (low <= v, above < v, v <= high,
    v < below) or choices (a sequence, or a callable for registries filled at import: their
    names, whose `in` may read plug-ins, see fewshot.runtime.plugins).
    `positional`: a command-line argument without a flag name."""
    metadata = {"help": help, "low": low, "above": above, "high": high, "below": below}
    metadata.update(choices=choices, flag=flag, positional=positional)
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def seed_setting(default: int = 0, help: str = "random seed") -> Any:
    """A seed field: an integer in [0, 2^63 - 1]."""
    return setting(default, help=help, low=0, high=SEED_MAX)


def describe(hint: Any) -> str:
    """'an integer', 'a number', ... for error messages."""
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    names.update({dict: "a JSON object", list: "a JSON list"})
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return " or ".join(describe(a) for a in args) + " (or null)"
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (list, tuple) and args:
        # JSON has no tuples: a fixed-length tuple is written as a list of that length.
        count = "" if len(args) == 1 or args[-1] is Ellipsis else f"{len(args)} "
        return f"a list of {count}{describe(args[0]).split(' ', 1)[1]}s"
    return names.get(typing.get_origin(hint) or hint, str(hint))


def check_type(key: str, hint: Any, value: Any) -> Any:
    """`value` as type `hint` (int for float, nothing else converted), or SettingError."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        for arg in typing.get_args(hint):
            if arg is not type(None):
                try:
                    return check_type(key, arg, value)
                except SettingError:
                    pass
        raise SettingError(key, f"must be {describe(hint)}, got {value!r}")
    full, hint = hint, origin or hint
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok and not math.isfinite(value):
            raise SettingError(key, f"must be a finite number, got {value!r}")
        value = float(value) if ok else value
    elif hint is dict:
        ok = isinstance(value, dict) and all(isinstance(k, str) for k in value)
    elif hint is list and typing.get_args(full):
        ok = isinstance(value, list)
        if ok:
            value = [check_type(key, typing.get_args(full)[0], item) for item in value]
    elif hint is tuple and typing.get_args(full):
        args = typing.get_args(full)
        ok = isinstance(value, list | tuple)
        items = args[:1] * len(value) if ok and args[-1] is Ellipsis else args
        ok = ok and len(value) == len(items)
        if ok:
            value = tuple(check_type(key, a, item) for a, item in zip(items, value, strict=True))
    else:
        ok = isinstance(value, hint)
    if not ok:
        raise SettingError(key, f"must be {describe(full)}, got {value!r}")
    return value


def check_range(key: str, value: Any, meta: dict) -> None:
    """Refuse a number outside the field's range or a string outside its choices."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        bounds = [
            ("low", ">=", lambda v, b: v >= b),
            ("above", ">", lambda v, b: v > b),
            ("high", "<=", lambda v, b: v <= b),
            ("below", "<", lambda v, b: v < b),
        ]
        wanted = [f"{sign} {meta[name]}" for name, sign, _ in bounds if meta[name] is not None]
        if not all(ok(value, meta[name]) for name, _, ok in bounds if meta[name] is not None):
            raise SettingError(key, f"must be {' and '.join(wanted)}, got {value!r}")
    choices = meta["choices"]
    if choices is not None and value is not None:
        allowed = choices() if callable(choices) else choices
        try:
            known = value in allowed  # a registry's names: may load a plug-in of that name
        except FewshotError as e:  # a plug-in it could not load
            raise SettingError(key, f"{value}: {e}") from None
        if not known:
            raise SettingError(key, f"must be one of {', '.join(map(str, allowed))}, got {value!r}")


def check_fields(obj: Any) -> None:
    """Check (and normalise int -> float) every field of a settings dataclass instance."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = check_type(f.name, hints[f.name], getattr(obj, f.name))
        if f.metadata:
            check_range(f.name, value, f.metadata)
        object.__setattr__(obj, f.name, value)  # also works on frozen dataclasses


# Parameters the caller fills itself, never options: a head's inputs (and centroid's CL2N base
# mean, computed by the evaluation), a backbone's geometry.
RESERVED_OPTIONS = {
    "query",
    "support",
    "support_labels",
    "way",
    "shot",
    "in_channels",
    "image_size",
    "settings",
    "center",
}


def check_options(key: str, options: dict, target: Callable, name: str | None = None) -> None:
    """Check keyword options for `target` (a function or class) against its signature: known
    names and their annotated types; errors call it `name` (default: its own name)."""
    params = inspect.signature(target).parameters.values()
    allowed = [
        p.name for p in params if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    allowed = [name for name in allowed if name not in RESERVED_OPTIONS]
    hints = typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
    for option, value in options.items():
        if option not in allowed:
            raise SettingError(
                key,
                f"has no option {option!r} for {name or target.__name__}; "
                f"known: {', '.join(allowed) or 'none'}",
            )
        if option in hints:
            check_type(f"{key}.{option}", hints[option], value)


def refuse_unused(
    obj: Any, unused: Iterable[str], owner: str, neutral: dict[str, Any] | None = None
) -> None:
    """The one rule for options that `owner` (e.g. '--method maml') does not read: each must
    hold its neutral value (its field's default, or `neutral[name]`: a value, or a frozenset
    of values that all mean the same), else SettingError.

    Value-based, not 'was it given': a checkpoint or config file that spells out a neutral
    value still builds, and a value that would change nothing is not an error.
    """
    defaults = {f.name: _field_default(f) for f in dataclasses.fields(obj)}
    for name in unused:
        value, wanted = getattr(obj, name), (neutral or {}).get(name, defaults[name])
        allowed = sorted(wanted, key=repr) if isinstance(wanted, frozenset) else [wanted]
        if all(value != a for a in allowed):  # ==, not hashing: dicts and lists compare too
            shown = " or ".join(map(repr, allowed))
            raise SettingError(
                name, f"does not apply to {owner} (got {value!r}; leave it at {shown})"
            )


def _field_default(f: dataclasses.Field) -> Any:
    """A dataclass field's default value (its factory's product for mutable defaults)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def flag_name(key: str) -> str:
    """'episodes_per_batch' -> '--episodes-per-batch'."""
    return "--" + key.replace("_", "-")


def read_json_object(path: str | Path, what: str = "config file") -> dict:
    """A JSON file that must hold an object; one-line errors for every way it can be wrong."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")  # a byte-order mark is harmless
    except FileNotFoundError:
        raise FewshotError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise FewshotError(f"{what} {path} is a folder, not a JSON file") from None
    except UnicodeDecodeError as e:
        raise FewshotError(f"{what} {path} is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise FewshotError(f"cannot read {what} {path}: {e.strerror}") from None
    try:
        values = json.loads(text)
    except json.JSONDecodeError as e:
        raise FewshotError(f"{what} {path} is not valid JSON: {e}") from None
    except RecursionError:  # the parser recurses once per level: a hostile file exhausts it
        raise FewshotError(f"{what} {path} is nested too deeply") from None
    if not isinstance(values, dict):
        raise FewshotError(f"{what} {path} must hold a JSON object, not a {type(values).__name__}")
    return values


def settings_keys(cls: type) -> set[str]:
    """The field names of a settings dataclass."""
    return {f.name for f in dataclasses.fields(cls)}


def build(cls: type[T], layers: Sequence[tuple[str, dict]]) -> T:
    """Defaults <- each (label, values) layer in turn; an error names its layer's flag or key.

    The label 'flags' means command-line values (errors say `--key`); any other label is a
    file or checkpoint (errors say `label: "key"`). Keys starting with '_' are comments. A class
    with `defaults_for(values) -> layers` gets those layers under the given ones.
    """
    known = settings_keys(cls)
    if hasattr(cls, "defaults_for"):  # defaults that depend on the values given (a method's)
        layers = [
            *cls.defaults_for({k: v for _, layer in layers for k, v in layer.items()}),
            *layers,
        ]
    values: dict = {}
    origin: dict[str, str] = {}
    for label, layer in layers:
        unknown = sorted(k for k in layer if k not in known and not k.startswith("_"))
        if unknown:
            raise FewshotError(f"{label}: unknown keys {', '.join(unknown)}")
        for key, value in layer.items():
            if key in known:
                values[key], origin[key] = value, label
    try:
        return cls(**values)
    except SettingError as e:
        key = e.key.split(".")[0]
        label = origin.get(key)
        if label == "flags":
            raise FewshotError(f"{flag_name(e.key)} {e.problem}") from None
        if label is None:  # a default that another given value rules out
            raise FewshotError(f"{flag_name(e.key)} {e.problem} (its default; set it)") from None
        raise FewshotError(f'{label}: "{e.key}" {e.problem}') from None


def layered_constructor(cls: type[T]) -> type[T]:
    """Make `cls(**values)` apply `cls.defaults_for(values)` under the values given, as `build`
    does under flags and files: settings built in Python get the command line's defaults."""
    generated = cls.__init__

    @functools.wraps(generated)
    def __init__(self: Any, **values: Any) -> None:
        layered: dict = {}
        for _, layer in cls.defaults_for(values):
            layered.update(layer)
        generated(self, **{**layered, **values})

    cls.__init__ = __init__
    return cls


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line errors (exit status 2) instead of usage + error."""

    def error(self, message: str) -> typing.NoReturn:
        """Print `prog: error: message` and exit 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def _without_none(hint: Any) -> Any:
    """X for `X | None`, else the hint itself."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _is_word_list(hint: Any) -> bool:
    """list[str] and the like: given as several words after one flag."""
    hint = _without_none(hint)
    return typing.get_origin(hint) is list and bool(typing.get_args(hint))


def _flag_type(hint: Any) -> Callable[[str], Any] | None:
    """How argparse turns a flag's text into the field's type (JSON for objects and lists)."""
    hint = _without_none(hint)
    if _is_word_list(hint):
        return typing.get_args(hint)[0]  # a list of words: nargs="+"
    base = typing.get_origin(hint) or hint
    if base in (dict, list):

        def parse_json(text: str) -> Any:
            try:
                return json.loads(text)
            except json.JSONDecodeError as e:
                raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None

        parse_json.__name__ = "JSON"
        return parse_json
    return base if base in (int, float, str) else None


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one flag per field of `cls` (bools as --x/--no-x); help shows the default.

    Flags default to 'absent' (argparse.SUPPRESS), so `given_flags` can tell what was typed.
    """
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.metadata.get("flag", False):
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        shown = json.dumps(default) if isinstance(default, dict | list) else default
        shown_default = not required and default is not None
        help_text = f.metadata["help"] + (f" (default: {shown})" if shown_default else "")
        kwargs: dict[str, Any] = {"help": help_text.replace("%", "%%")}
        kwargs["default"] = argparse.SUPPRESS
        if _without_none(hints[f.name]) is bool:  # bool | None: --x, --no-x or neither
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = _flag_type(hints[f.name])
            if _is_word_list(hints[f.name]):
                kwargs["nargs"] = "+"
            choices = f.metadata["choices"]
            if choices is not None:
                # A registry's choices (a callable) are filled at import, before any parser.
                allowed = choices() if callable(choices) else choices
                kwargs["metavar"] = "{" + ",".join(allowed) + "}"
        if f.metadata.get("positional"):
            if not required:  # an optional positional: none, or any number for a list
                kwargs["nargs"] = "*" if _is_word_list(hints[f.name]) else "?"
            parser.add_argument(f.name, **kwargs)
        else:
            parser.add_argument(flag_name(f.name), dest=f.name, required=required, **kwargs)


def given_flags(args: argparse.Namespace, cls: type) -> dict:
    """The fields of `cls` that were given on the command line."""
    return {k: v for k, v in vars(args).items() if k in settings_keys(cls)}


@dataclasses.dataclass(frozen=True)
class Command:
    """One `fewshot` sub-command: its settings dataclasses (their fields are its flags) and
    `run(*settings)`. `path` is e.g. ("train",) or ("hpo", "cleaning").

    When a command has two settings classes, the first is built from its flags alone and may
    define `sources() -> [(label, values), ...]`: layers (a config file, a checkpoint's
    settings) that the second is built from, under its flags.
    """

    path: tuple[str, ...]
    help: str
    settings: tuple[type, ...]
    run: Callable[..., Any]

    def build_settings(self, args: argparse.Namespace) -> list:
        """The command's settings objects from parsed flags, each checked as it is built."""
        built: list = []
        for cls in self.settings:
            sources = built[0].sources() if built and hasattr(built[0], "sources") else []
            built.append(build(cls, [*sources, ("flags", given_flags(args, cls))]))
        return built
