"""EHG for the adaptation methods: Omniglot, ANIL and MAML, U = 1 vs 5, several training seeds.

The driver of ../ehg_convergence (CLI only, resumable, paired by seed) with this study's
defaults: the MAML paper's Omniglot episodes (5-way 1-shot 15-query, stride-2 Conv-4, one inner
step of 0.4, three at test time) in meta-batches of 4, 800 training episodes, 5-way tests.
Any flag of that driver given here overrides the default.

    python -m experiments.ehg_adaptation.study    # from the repository root
    python -m experiments.ehg_adaptation.study --smoke --out DIR    # the test suite's run
"""

from __future__ import annotations

import sys

from experiments.ehg_convergence import study as convergence

DEFAULTS = [
    "--methods", "anil,maml", "--way", "5", "--query", "15", "--test-ways", "5",
    "--epochs", "10", "--episodes-per-epoch", "80", "--episodes-per-batch", "4",
    "--thresholds", "65,75,80",
    "--runs", "runs/ehg_adaptation", "--out", "experiments/ehg_adaptation",
]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """The convergence study with this study's defaults, under the given flags."""
    convergence.main([*DEFAULTS, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
