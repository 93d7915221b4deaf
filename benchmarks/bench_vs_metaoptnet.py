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
from pathlib import Path

from fewshot.config import TrainConfig
from fewshot.precision import AMP_CHOICES

DEFAULT_REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"


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
    spec = importlib.util.spec_from_file_location("bench_vs_metaoptnet_reference", script)
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)

    def config(**values) -> TrainConfig:
        # The harness passes its own splits; its dataset name only has to be a valid one.
        return TrainConfig(**{**values, "dataset": "miniimagenet", "amp": args.amp})

    harness.TrainConfig = config
    sys.argv = [str(script), *args.harness_args]
    print(f"fewshot steps with --amp {args.amp}; MetaOptNet in float32")
    harness.main()


if __name__ == "__main__":
    main()
