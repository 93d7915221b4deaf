#!/usr/bin/env bash
# Set up .venv, meta-train a Conv-4 ProtoNet on the shipped Omniglot for a few minutes,
# then evaluate it on 1000 seeded 5-way 1-shot test episodes (accuracy ± 95% CI).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
out=runs/quickstart
# --overwrite: running the quickstart again replaces its previous run.
.venv/bin/fewshot train --config models/omniglot/quickstart.json --out "$out" --overwrite
.venv/bin/fewshot eval --checkpoint "$out/best.pt" --way 5 --shot 1 --query 15 \
    --episodes 1000 --seed 0
