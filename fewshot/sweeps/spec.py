"""Sweep specs: a YAML file naming a config, a matrix of overrides and the evaluations of each
trained model, read into typed dataclasses.

Every key is typed and checked when read, as a benchmark suite's are: an unknown key or a wrong
type is one line naming the file and the key. The overrides and every value of the matrix are
checked against the command's settings (TrainSettings or PretrainSettings) on the config file,
so that a bad one is named before any job runs.
"""

from __future__ import annotations

import json
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import (
    SettingError,
    build,
    check_fields,
    flag_name,
    seed_setting,
    setting,
    settings_keys,
)
from fewshot.training.settings import STAGES, read_config_file

MAX_SPEC_BYTES = 1 << 20  # a spec is a few lines; a larger file is not one
NAME = re.compile(r"[a-z0-9][a-z0-9-]*\Z")  # the sweep's name becomes a folder's
UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")  # what a value may not hold in a folder's name
SEED = "seed"  # the matrix key whose values pair the arms of a comparison


@dataclass(frozen=True, kw_only=True)
class Shape:
    """An episode shape each trained model is evaluated on (`fewshot eval`)."""

    way: int = setting(help="classes per episode", low=2)
    shot: int = setting(help="support images per class", low=1)

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def label(self) -> str:
        """WwSs: how folders, files and reports name the shape."""
        return f"{self.way}w{self.shot}s"


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """What each trained model's last.pt is evaluated on: a suite, shapes, or both."""

    suite: str | None = setting(
        None, help="a benchmark suite (NAME-vVERSION or a .yaml file) for fewshot bench"
    )
    limit: int | None = setting(None, help="bench the first N episodes of each cell", low=2)
    shapes: tuple[Shape, ...] = setting(
        help="episode shapes for fewshot eval: [{way: W, shot: S}, ...]", default_factory=tuple
    )
    episodes: int = setting(1000, help="test episodes of each shape", low=2)
    seed: int = seed_setting(0, help="seed of the shapes' test episodes")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.suite is None and not self.shapes:
            raise SettingError("shapes", "or suite must be given: what each model is tested on")
        if self.limit is not None and self.suite is None:
            raise SettingError("limit", "applies to a suite: give suite too")
        labels = [shape.label for shape in self.shapes]
        twice = sorted({label for label in labels if labels.count(label) > 1})
        if twice:
            raise SettingError("shapes", f"gives {twice[0]} twice")


@dataclass(frozen=True, kw_only=True)
class Spec:
    """A sweep: one training job per combination of the matrix, then the evaluations."""

    name: str = setting(help="the sweep's name: lower-case letters, digits and '-'")
    command: str = setting("train", help="the training command", choices=tuple(STAGES))
    config: str = setting(help="the JSON config file of every job, relative to the current folder")
    out: str | None = setting(None, help="the sweep's folder (default: runs/sweeps/NAME)")
    overrides: dict = setting(help="settings of every job", default_factory=dict)
    matrix: dict = setting(help="KEY: [VALUE, ...]: one job per combination of the values")
    evaluate: Evaluation | None = setting(None, help="what each trained model is tested on")
    compare: str | None = setting(None, help="a matrix key whose arms are compared across seeds")

    def __post_init__(self) -> None:
        check_fields(self)
        if not NAME.match(self.name):
            raise SettingError(
                "name", f"must be lower-case letters, digits and '-', got {self.name!r}"
            )
        self._check_matrix()
        both = sorted(set(self.overrides) & set(self.matrix))
        if both:
            raise SettingError("overrides", f"and matrix both set {both[0]!r}: give it once")
        if "out" in self.overrides or "out" in self.matrix:
            where = "overrides" if "out" in self.overrides else "matrix"
            raise SettingError(where, "cannot set out: the sweep names each run's folder")
        if self.compare is not None:
            self._check_compare(self.compare)

    def _check_matrix(self) -> None:
        """A list of values for each key, no two of which name one run folder."""
        if not self.matrix:
            raise SettingError("matrix", "must hold a key or more, each with its list of values")
        for key, values in self.matrix.items():
            if not isinstance(values, list) or not values:
                raise SettingError(f"matrix.{key}", "must be a list of one value or more")
            named: dict[str, int] = {}  # a run folder's part: the first value that names it
            for index, value in enumerate(values):
                first = named.setdefault(part(key, value), index)
                if first != index:
                    raise SettingError(
                        f"matrix.{key}",
                        f"values {values[first]!r} and {value!r} both name the run folder "
                        f"{part(key, value)}: give values that differ in letters, digits or '.+-_'",
                    )

    def _check_compare(self, key: str) -> None:
        """A comparison needs its key's arms and the seeds that pair them in the matrix."""
        if key == SEED or key not in self.matrix:
            raise SettingError("compare", f"must name a matrix key other than seed, got {key!r}")
        if len(self.matrix[key]) < 2:
            raise SettingError("compare", f"needs two values of {key} or more in the matrix")
        if len(self.matrix.get(SEED, [])) < 2:
            raise SettingError("compare", "needs seed in the matrix with two values or more")
        if self.evaluate is None:
            raise SettingError("compare", "needs evaluate: what the arms are compared on")

    @property
    def settings_class(self) -> type:
        """The settings of the command's jobs (TrainSettings or PretrainSettings)."""
        return STAGES[self.command]

    @property
    def folder(self) -> Path:
        """The sweep's folder: out, or runs/sweeps/NAME."""
        return Path(self.out or Path("runs") / "sweeps" / self.name)


def part(key: str, value: object) -> str:
    """KEY=VALUE, a matrix value as a run folder's name holds it: its unsafe characters
    replaced by '_'."""
    text = value if isinstance(value, str) else json.dumps(value)
    return f"{key}={UNSAFE.sub('_', text)}"


def read_spec(path: Path) -> Spec:
    """Read and check a spec file: its keys and types, its config file, and its overrides and
    matrix values against the command's settings."""
    import yaml  # here: only the commands that read specs need it

    label = f"spec file {path}"
    if not path.is_file():
        raise FewshotError(f"{label} not found")
    if path.stat().st_size > MAX_SPEC_BYTES:
        raise FewshotError(f"{label} is over {MAX_SPEC_BYTES >> 10} KiB: not a spec")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        summary = " ".join(str(e).split())
        raise FewshotError(f"{label} is not valid YAML: {summary}") from None
    if not isinstance(values, dict):
        raise FewshotError(f"{label} must hold a mapping of keys")
    if values.get("evaluate") is not None:
        values["evaluate"] = read_evaluation(values["evaluate"], label)
    spec = build(Spec, [(label, values)])
    check_settings(spec, label)
    return spec


def read_evaluation(values: object, label: str) -> Evaluation:
    """The `evaluate` mapping of a spec, its shapes built one by one."""
    if not isinstance(values, dict):
        raise FewshotError(f'{label}: "evaluate" must be a mapping of keys')
    shapes = values.get("shapes", [])
    if not isinstance(shapes, list) or not all(isinstance(s, dict) for s in shapes):
        raise FewshotError(f'{label} evaluate: "shapes" must be a list of {{way: W, shot: S}}')
    built = tuple(
        build(Shape, [(f"{label} evaluate shape {number}", shape)])
        for number, shape in enumerate(shapes, 1)
    )
    return build(Evaluation, [(f"{label} evaluate", {**values, "shapes": built})])


def check_settings(spec: Spec, label: str) -> None:
    """Build the command's settings on the config file with the overrides and each value of
    the matrix (the other keys at their first value): a key the command does not take, or a
    value it refuses, is named before any job runs. Once per value, not per job: a spec of
    thousands of jobs is checked in a moment."""
    cls = spec.settings_class
    try:
        config = read_config_file(spec.config)
    except FewshotError as e:
        raise FewshotError(f"{label}: {e}") from None
    known = settings_keys(cls)
    for where, keys in (("overrides", spec.overrides), ("matrix", spec.matrix)):
        unknown = [key for key in keys if key not in known]
        if unknown:
            raise FewshotError(
                f'{label}: {where} key "{unknown[0]}" is not a setting of fewshot {spec.command}'
            )
    firsts = {key: values[0] for key, values in spec.matrix.items()}
    combinations = [firsts] + [
        {**firsts, key: value} for key, values in spec.matrix.items() for value in values[1:]
    ]
    for combination in combinations:
        layers = [(f"config file {spec.config}", config), (f"{label} overrides", spec.overrides)]
        build(cls, [*layers, (f"{label} matrix", combination)])
    given = [("overrides", key, value) for key, value in spec.overrides.items()]
    given += [("matrix", key, value) for key, values in spec.matrix.items() for value in values]
    for where, key, value in given:
        try:
            setting_flags(cls, {key: value})
        except SettingError as e:
            raise FewshotError(f'{label} {where}: "{e.key}" {e.problem}') from None


def setting_flags(cls: type, values: dict) -> list[str]:
    """Settings `values` of the settings class `cls` as the command line gives them: --key
    VALUE, --key / --no-key for true / false, words for a list of words, JSON for an object or
    list."""
    hints = typing.get_type_hints(cls)
    argv: list[str] = []
    for key, value in values.items():
        flag, words = flag_name(key), takes_words(hints[key])
        if value is None or (words and not value):
            raise SettingError(key, "cannot be given on a command line (null, or no words)")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif words:
            argv += [flag, *map(str, value)]
        else:
            text = json.dumps(value) if isinstance(value, dict | list) else str(value)
            # A value that starts with '-' would read as a flag of its own.
            argv += [f"{flag}={text}"] if text.startswith("-") else [flag, text]
    return argv


def takes_words(hint: object) -> bool:
    """Whether a field of type `hint` (list[str], ...) takes several words after its flag."""
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = [a for a in typing.get_args(hint) if a is not type(None)] if optional else [hint]
    return any(typing.get_origin(kind) is list and typing.get_args(kind) for kind in kinds)
