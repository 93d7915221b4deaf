"""fewshot's training step against MetaOptNet's own, with the shared reference harness.

The harness (`bench_vs_metaoptnet.py` in the shared reference folder, beside MetaOptNet's model
code; not part of this repository) times MetaOptNet's step and `Trainer.train_step` in one
process, interleaved. This wrapper runs it with fewshot's steps in a chosen precision: `--amp
off` compares both in float32, `--amp auto` (fewshot's default: bf16 on CPUs with native bf16)
compares what a user of each gets; MetaOptNet always runs in float32. Other arguments go to the
harness (its --help lists them).

--smoke runs the harness at its smallest sizes (ProtoNet, 1 episode of 5-way 1-shot 2-query,
U = 2, one repetition, on the CPU); without the harness (a fresh clone), it times fewshot's side
alone through the same adapters, so that they cannot rot unseen.

    python -m benchmarks.bench_vs_metaoptnet --amp off -- --device cpu --backbone conv4 --reps 7
    python -m benchmarks.bench_vs_metaoptnet --smoke    # seconds: the test suite's run
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

from experiments.resnet12_rehearsal.synthetic import synthetic_split
from fewshot.runtime.device import resolve_device
from fewshot.runtime.precision import AMP_CHOICES
from fewshot.training.settings import TrainSettings
from fewshot.training.trainer import Trainer

DEFAULT_REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"
# --smoke: the harness's smallest run (its flags; the caller's after them win).
SMOKE_HARNESS = [
    "--device", "cpu", "--heads", "protonet", "--query", "2", "--episodes", "1", "--ehg", "2",
    "--reps", "1", "--threads", "1",
]  # fmt: skip


def load_harness(script: Path) -> types.ModuleType:
    """The harness module. It imports `TrainConfig` and `Trainer` from the library's former
    modules (fewshot.config, fewshot.train); stand-ins for those imports are in place while it
    loads, and `main` replaces both names with adapters to the current API."""
    stand_ins = {"fewshot.config": "TrainConfig", "fewshot.train": "Trainer"}
    saved = {name: sys.modules.get(name) for name in stand_ins}
    for name, attribute in stand_ins.items():
        module = types.ModuleType(name)
        setattr(module, attribute, None)
        sys.modules[name] = module
    try:
        spec = importlib.util.spec_from_file_location("bench_vs_metaoptnet_reference", script)
        harness = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(harness)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return harness


def settings_adapter(amp: str) -> Callable[..., TrainSettings]:
    """The harness's `TrainConfig(**values)`, as fewshot's settings in precision `amp`."""

    def config(**values) -> TrainSettings:
        # The harness passes its own splits; its dataset name only has to be a valid one.
        # It names U by the library's former setting, ehg_splits.
        values["resplits"] = values.pop("ehg_splits", values.get("resplits", 1))
        return TrainSettings(**{**values, "dataset": "miniimagenet", "amp": amp})

    return config


def trainer_adapter(settings: TrainSettings, splits=None) -> Trainer:
    """The harness's former `Trainer(config, splits=...)`, as fewshot's Trainer."""
    return Trainer(settings, resolve_device(settings.device), data=splits)


def own_side(config: Callable[..., TrainSettings]) -> None:
    """fewshot's smoke steps without the harness: settings and trainer made through the
    adapters from the keyword arguments the harness passes, on synthetic 84x84 images."""
    split = synthetic_split(5, 3, 3, 84, 0)  # 5 classes of 1 support and 2 query images
    for head in ("protonet", "ridge", "svm"):
        settings = config(
            dataset="synthetic", backbone="conv4", head=head, way=5, shot=1, query=2,
            episodes_per_batch=1, augment=False, device="cpu", ehg_splits=2, label_smoothing=0.1,
        )  # fmt: skip
        step = trainer_adapter(settings, (split, split)).train_step
        step()  # warm-up
        start = time.perf_counter()
        step()
        print(f"fewshot EHG U=2 step {head}: {1000 * (time.perf_counter() - start):.1f} ms")


def main() -> None:
    """Load the harness, make its fewshot steps use --amp, and run it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--amp", default="off", choices=AMP_CHOICES, help="fewshot's precision")
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE, help="its folder")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (see above)")
    parser.add_argument("harness_args", nargs="*", help="arguments of the harness (after --)")
    args = parser.parse_args()
    script = args.reference / "bench_vs_metaoptnet.py"
    config = settings_adapter(args.amp)
    if not script.is_file():
        missing = f"no reference harness at {script} (give its folder with --reference)"
        if not args.smoke:
            sys.exit(missing)
        print(f"{missing}: fewshot's side alone, --amp {args.amp}")
        own_side(config)
        return
    harness = load_harness(script)
    harness.TrainConfig = config
    harness.Trainer = trainer_adapter
    smoke = SMOKE_HARNESS if args.smoke else []
    sys.argv = [str(script), *smoke, *args.harness_args]
    print(f"fewshot steps with --amp {args.amp}; MetaOptNet in float32")
    harness.main()


if __name__ == "__main__":
    main()
