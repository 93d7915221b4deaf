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
from functools import cache, cached_property
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
CONFIG = "config"  # a named variant's own config file, in place of the spec's
CHECKPOINTS = ("last", "best")
# Settings of fewshot eval that the spec gives each evaluation itself: not options.
EVAL_GIVEN = ("checkpoint", "backbone", "way", "shot", "episodes", "seed", "out", "per_episode")


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
    checkpoint: str = setting(
        "last", help="the checkpoint of each run tested: last.pt or best.pt", choices=CHECKPOINTS
    )
    options: dict = setting(
        help="more fewshot eval settings of the shapes' evaluations (query, inner_steps, ...)",
        default_factory=dict,
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.suite is None and not self.shapes:
            raise SettingError("shapes", "or suite must be given: what each model is tested on")
        if self.options and not self.shapes:
            raise SettingError("options", "apply to the shapes' evaluations: give shapes too")
        if self.limit is not None and self.suite is None:
            raise SettingError("limit", "applies to a suite: give suite too")
        labels = [shape.label for shape in self.shapes]
        twice = sorted({label for label in labels if labels.count(label) > 1})
        if twice:
            raise SettingError("shapes", f"gives {twice[0]} twice")


@dataclass(frozen=True)
class Value:
    """One value of a matrix key: the part of the run folder's name it gives (KEY=VALUE) and
    the settings it sets (one, or a named variant's several)."""

    part: str
    settings: dict


@dataclass(frozen=True, kw_only=True)
class Spec:
    """A sweep: one training job per combination of the matrix, then the evaluations."""

    name: str = setting(help="the sweep's name: lower-case letters, digits and '-'")
    about: str | None = setting(None, help="what the sweep measures: the report's first lines")
    command: str = setting("train", help="the training command", choices=tuple(STAGES))
    config: str | None = setting(
        None,
        help="the JSON config file of every job, relative to the current folder (or a config "
        "key of each named variant of the matrix)",
    )
    out: str | None = setting(
        None, help="the sweep's folder: evaluations and report (default: runs/sweeps/NAME)"
    )
    runs: str | None = setting(None, help="the folder of the training runs (default: OUT/runs)")
    overrides: dict = setting(help="settings of every job", default_factory=dict)
    matrix: dict | list = setting(
        help="KEY: [VALUE, ...] (or KEY: {NAME: {SETTING: VALUE, ...}, ...}, named variants): "
        "one job per combination of the values; a list of such mappings: the union of each's jobs"
    )
    evaluate: Evaluation | None = setting(None, help="what each trained model is tested on")
    compare: str | None = setting(None, help="a matrix key whose arms are compared across seeds")

    def __post_init__(self) -> None:
        check_fields(self)
        if not NAME.match(self.name):
            raise SettingError(
                "name", f"must be lower-case letters, digits and '-', got {self.name!r}"
            )
        blocks = self.blocks  # checks each block's keys and values
        for block in blocks:
            for key, values in block.items():
                given = {name for value in values for name in value.settings}
                both = sorted(given & set(self.overrides))
                if both:
                    raise SettingError(
                        f"matrix.{key}", f"and overrides both set {both[0]!r}: give it once"
                    )
                if "out" in given:
                    raise SettingError(f"matrix.{key}", "cannot set out: the sweep names it")
        if "out" in self.overrides:
            raise SettingError("overrides", "cannot set out: the sweep names each run's folder")
        # A job without a config: in a block where every key has a value without one.
        if self.config is None and any(
            all(any(CONFIG not in value.settings for value in values) for values in block.values())
            for block in blocks
        ):
            raise SettingError("config", "must be given (or a config key in every named variant)")
        if self.compare is not None:
            self._check_compare(self.compare)

    @cached_property
    def blocks(self) -> list[dict[str, list[Value]]]:
        """The matrix as products of values: one mapping of each key's values per block (a
        single mapping is one block), every block with the same keys in the same order."""
        raw = self.matrix if isinstance(self.matrix, list) else [self.matrix]
        if not raw:
            raise SettingError("matrix", "must hold a key or more, each with its list of values")
        blocks = []
        for number, block in enumerate(raw, 1):
            where = "matrix" if isinstance(self.matrix, dict) else f"matrix block {number}"
            if not isinstance(block, dict) or not block:
                raise SettingError(where, "must hold a key or more, each with its list of values")
            if list(block) != list(raw[0]):
                raise SettingError(where, f"must have the first block's keys {list(raw[0])}")
            blocks.append(
                {key: matrix_values(f"{where}.{key}", key, v) for key, v in block.items()}
            )
        return blocks

    @property
    def keys(self) -> list[str]:
        """The matrix's keys, in the order run folders name them."""
        return list(self.blocks[0])

    def _check_compare(self, key: str) -> None:
        """A comparison needs its key's arms and the seeds that pair them in the matrix."""
        if key == SEED or key not in self.keys:
            raise SettingError("compare", f"must name a matrix key other than seed, got {key!r}")
        if len(key_parts(self, key)) < 2:
            raise SettingError("compare", f"needs two values of {key} or more in the matrix")
        if SEED not in self.keys or len(key_parts(self, SEED)) < 2:
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


def matrix_values(where: str, key: str, values: object) -> list[Value]:
    """A matrix key's values: a list of the setting KEY's values, or named variants (a mapping
    of names to their settings); no two of which name one run folder."""
    if isinstance(values, dict) and values:
        if not all(isinstance(settings, dict) and settings for settings in values.values()):
            raise SettingError(where, "named variants must each be a mapping of settings")
        found = [Value(part(key, name), settings) for name, settings in values.items()]
        shown = list(values)
    elif isinstance(values, list) and values:
        found, shown = [Value(part(key, value), {key: value}) for value in values], values
    else:
        raise SettingError(where, "must be a list of one value or more (or named variants)")
    named: dict[str, int] = {}  # a run folder's part: the first value that names it
    for index, value in enumerate(found):
        first = named.setdefault(value.part, index)
        if first != index:
            raise SettingError(
                where,
                f"values {shown[first]!r} and {shown[index]!r} both name the run folder "
                f"{value.part}: give values that differ in letters, digits or '.+-_'",
            )
    return found


def key_parts(spec: Spec, key: str) -> list[str]:
    """The run folders' parts (KEY=VALUE) of a matrix key across the blocks, in order."""
    return list(dict.fromkeys(value.part for block in spec.blocks for value in block[key]))


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
    value it refuses, is named before any job runs (the evaluation's options are checked by
    fewshot sweep, against fewshot eval's settings). Once per value, not per job: a spec of
    thousands of jobs is checked in a moment."""
    cls = spec.settings_class
    known = settings_keys(cls)
    given = [("overrides", key, value) for key, value in spec.overrides.items()]
    for block in spec.blocks:
        given += [
            ("matrix", key, value)
            for values in block.values()
            for found in values
            for key, value in found.settings.items()
        ]
    for where, key, _ in given:
        if key not in known and not (where == "matrix" and key == CONFIG):
            raise FewshotError(
                f'{label}: {where} key "{key}" is not a setting of fewshot {spec.command}'
            )
    configs: dict[str, dict] = {}  # each config file, read once
    for block in spec.blocks:
        firsts = [values[0] for values in block.values()]
        combinations = [firsts] + [
            [*firsts[:index], value, *firsts[index + 1 :]]
            for index, values in enumerate(block.values())
            for value in values[1:]
        ]
        for combination in combinations:
            merged = {k: v for value in combination for k, v in value.settings.items()}
            path = job_config(spec, merged)
            if path not in configs:
                try:
                    configs[path] = read_config_file(path)
                except FewshotError as e:
                    raise FewshotError(f"{label}: {e}") from None
            layers = [(f"config file {path}", configs[path])]
            layers += [(f"{label} overrides", spec.overrides)]
            build(cls, [*layers, (f"{label} matrix", without_config(merged))])
    for where, key, value in given:
        if key == CONFIG:
            continue
        try:
            setting_flags(cls, {key: value})
        except SettingError as e:
            raise FewshotError(f'{label} {where}: "{e.key}" {e.problem}') from None


def job_config(spec: Spec, settings: dict) -> str:
    """The config file of a job with the matrix's `settings`: its variant's, else the spec's."""
    path = settings.get(CONFIG, spec.config)
    if not isinstance(path, str):
        raise FewshotError(f"the config of {settings} must be a file's path, got {path!r}")
    return path


def without_config(settings: dict) -> dict:
    """The matrix's settings but a variant's config file: what the command's settings take."""
    return {key: value for key, value in settings.items() if key != CONFIG}


def setting_flags(cls: type, values: dict) -> list[str]:
    """Settings `values` of the settings class `cls` as the command line gives them: --key
    VALUE, --key / --no-key for true / false, words for a list of words, JSON for an object or
    list."""
    hints = type_hints(cls)
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


@cache
def type_hints(cls: type) -> dict:
    """The field types of a settings class, resolved once: a sweep of thousands of jobs turns
    each one's settings into flags."""
    return typing.get_type_hints(cls)


def takes_words(hint: object) -> bool:
    """Whether a field of type `hint` (list[str], ...) takes several words after its flag."""
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = [a for a in typing.get_args(hint) if a is not type(None)] if optional else [hint]
    return any(typing.get_origin(kind) is list and typing.get_args(kind) for kind in kinds)
