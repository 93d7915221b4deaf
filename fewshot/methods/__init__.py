"""What trains and evaluates an episode: the method interface, its registry, EHG re-splits.

A method is registered under a name with a builder `(settings, **method_options) -> Method`,
where `settings` is a run's settings as a dict (with the data's `in_channels` and `image_size`).
Another package's method joins by an entry point of the group `fewshot.methods` naming its
builder, or a `MethodPlugin` (its builder with the training defaults it starts from); what the
builder returns is checked, and the trainer checks each training step's output (`check_step`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fewshot.heads import head_names
from fewshot.methods.adaptation import AdaptationMethod
from fewshot.methods.adaptation_builders import adaptation_builder
from fewshot.methods.base import Method
from fewshot.methods.embedding import EmbeddingMethod, build_embedding_method
from fewshot.methods.maml_family import MAML_TRAINING, VARIANTS, unused_settings
from fewshot.methods.matching import build_matching_method
from fewshot.methods.relation import build_relation_method
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.plugins import RegistryNames, described, require_signature

MethodBuilder = Callable[..., Method]

METHODS: dict[str, MethodBuilder] = {}
# Per method: the training settings it starts from, under any config file and flags.
TRAINING_DEFAULTS: dict[str, dict] = {}
# Per method: the training settings it never reads, refused unless neutral (its training
# default where it gives one, else the general default).
UNUSED_SETTINGS: dict[str, frozenset[str]] = {}


def register_method(
    name: str,
    builder: MethodBuilder,
    training_defaults: dict | None = None,
    unused: frozenset[str] = frozenset(),
) -> None:
    """Make a method available to the settings (`--method NAME`), training and evaluation;
    `training_defaults` (e.g. its optimizer) replace the general defaults for it, and the
    settings named in `unused` are refused unless they keep their neutral value."""
    METHODS[name] = builder
    TRAINING_DEFAULTS[name] = training_defaults or {}
    UNUSED_SETTINGS[name] = frozenset(unused)


@dataclass(frozen=True)
class MethodPlugin:
    """What a `fewshot.methods` entry point names when its method starts from other training
    settings than the general defaults: `register_method`'s arguments but the name."""

    builder: MethodBuilder
    training_defaults: dict = field(default_factory=dict)
    unused: frozenset[str] = frozenset()


def _adopt_method(name: str, plugin: object) -> None:
    """Register a plug-in method: a builder `(settings, **method_options) -> Method`, or a
    MethodPlugin; TypeError when it is neither."""
    spec = plugin if isinstance(plugin, MethodPlugin) else MethodPlugin(plugin)
    require_signature(
        spec.builder,
        "a builder (settings: dict, **method_options) -> Method, its options with defaults",
        {},
    )
    if not isinstance(spec.training_defaults, dict):
        raise TypeError(
            f"training_defaults must be a dict, not {described(spec.training_defaults)}"
        )
    register_method(name, spec.builder, spec.training_defaults, frozenset(spec.unused))


_NAMES = RegistryNames("fewshot.methods", "method", METHODS.keys(), _adopt_method)


def method_names() -> RegistryNames:
    """The method names (the settings' choices): `name in method_names()` also finds and
    registers a plug-in method (entry point group `fewshot.methods`)."""
    return _NAMES


def build_method(settings: dict) -> Method:
    """The method a run's settings describe (keys method, method_options and the method's own);
    a plug-in method or head named there is registered first, and a plug-in builder's result
    that is not a Method is refused in one line naming it."""
    for names, key in ((_NAMES, "method"), (head_names(), "head")):
        if key in settings and settings[key] not in names:
            raise FewshotError(f"unknown {key} {settings[key]!r}; choose one of {', '.join(names)}")
    method = METHODS[settings["method"]](settings, **settings["method_options"])
    if not isinstance(method, Method):  # a plug-in's builder: the trainer reads the interface
        raise FewshotError(
            f"{_NAMES.label(settings['method'])} built {described(method)}: its builder must "
            "return a fewshot.methods.Method"
        )
    return method


register_method("embedding", build_embedding_method)
# The comparison module replaces the head: its options are the method's.
_NO_HEAD = frozenset({"head", "head_options", "eval_head_options"})
register_method("matching", build_matching_method, unused=_NO_HEAD)
register_method("relation", build_relation_method, unused=_NO_HEAD | {"label_smoothing"})
for _variant in VARIANTS:
    register_method(
        _variant, adaptation_builder(_variant), MAML_TRAINING, unused_settings(_variant)
    )

__all__ = [
    "METHODS",
    "TRAINING_DEFAULTS",
    "UNUSED_SETTINGS",
    "AdaptationMethod",
    "EmbeddingMethod",
    "Method",
    "MethodPlugin",
    "build_method",
    "method_names",
    "register_method",
]
