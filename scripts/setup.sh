#!/usr/bin/env bash
# Create .venv (once) and install fewshot into it. Usage: scripts/setup.sh [test]
# With "test", also installs the test tools (timm among them, for the timm backbones' tests) and
# the optional learn2learn (for the reuse test).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
trap 'echo "setup interrupted: run it again to finish" >&2; exit 130' INT
# A venv without pip (its creation was interrupted) is made again, not reused.
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    "$PYTHON" -m venv --clear .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# The pinned torch/torchvision pair first, so nothing pulls a newer one.
.venv/bin/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1"
if [ "${1:-}" = "test" ]; then
    .venv/bin/python -m pip install -q -e ".[test,tensorboard,docs]"
    # qpth (the SVM head's comparison solver) pins numpy<2 in its metadata only, and
    # learn2learn requires qpth: both without their dependencies, so the suite runs on numpy 2
    # (their code does), learn2learn with what it imports. learn2learn 0.2.0 only builds on
    # Python 3.11 with its extensions built explicitly.
    .venv/bin/python -m pip install -q --no-deps "qpth==0.0.18"
    .venv/bin/python -m pip show -q learn2learn >/dev/null 2>&1 ||
        { .venv/bin/python -m pip install -q --no-deps "learn2learn==0.2.0" \
            --config-settings=--build-option=build_ext &&
            .venv/bin/python -m pip install -q gym requests; } ||
        echo "note: learn2learn did not install; its reuse test will be skipped" >&2
else
    .venv/bin/python -m pip install -q -e ".[tensorboard]"
fi
