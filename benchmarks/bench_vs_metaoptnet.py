"""fewshot's training step against MetaOptNet's own, with the shared reference harness.

The harness (`bench_vs_metaoptnet.py` in the shared reference folder, beside MetaOptNet's model
code; not part of this repository) times MetaOptNet's step and `Trainer.train_step` in one
process, interleaved. This wrapper runs it with fewshot's steps in a chosen precision: `--amp
off` compares both in float32, `--amp auto` (fewshot's default: bf16 on CPUs with native bf16)
compares what a user of each gets; MetaOptNet always runs in float32. Other arguments go to the
harness (its --help lists them).

    python -m benchmarks.bench_vs_metaoptnet --amp off -- --device cpu --backbone conv4 --reps 7
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from pathlib import Path

from fewshot.runtime.device import resolve_device
from fewshot.runtime.precision import AMP_CHOICES
from fewshot.training.settings import TrainSettings
from fewshot.training.trainer import Trainer

DEFAULT_REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"


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


def main() -> None:
    """Load the harness, make its fewshot steps use --amp, and run it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--amp", default="off", choices=AMP_CHOICES, help="fewshot's precision")
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE, help="its folder")
    parser.add_argument("harness_args", nargs="*", help="arguments of the harness (after --)")
    args = parser.parse_args()
    script = args.reference / "bench_vs_metaoptnet.py"
    if not script.is_file():
        sys.exit(f"no reference harness at {script} (give its folder with --reference)")
    harness = load_harness(script)

    def config(**values) -> TrainSettings:
        # The harness passes its own splits; its dataset name only has to be a valid one.
        # It names U by the library's former setting, ehg_splits.
        values["resplits"] = values.pop("ehg_splits", values.get("resplits", 1))
        return TrainSettings(**{**values, "dataset": "miniimagenet", "amp": args.amp})

    def trainer(settings: TrainSettings, splits=None) -> Trainer:
        # The harness builds its trainers with the former signature Trainer(config, splits=...).
        return Trainer(settings, resolve_device(settings.device), data=splits)

    harness.TrainConfig = config
    harness.Trainer = trainer
    sys.argv = [str(script), *args.harness_args]
    print(f"fewshot steps with --amp {args.amp}; MetaOptNet in float32")
    harness.main()


if __name__ == "__main__":
    main()
