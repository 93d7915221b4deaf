#!/usr/bin/env bash
# The checks that need a GPU, in one run of at most 7 minutes (the parts' limits add up to 405
# s), every figure under OUT_DIR: the CUDA tests, the throughput, EHG, precision (float32 against
# bf16: the measurement that decides --amp auto on GPUs) and MAML-family benchmarks, and the
# MetaOptNet side-by-side when the shared reference folder is beside the repository. Each part has
# its own time limit, so a slow part cannot starve the others.
#
# Usage, from the repository root: bash benchmarks/cuda_checks.sh [--smoke] [OUT_DIR]
# (default OUT_DIR runs/cuda; fewshot importable by $PYTHON, default python3). --smoke runs every
# part on the CPU at tiny sizes: a test of this script, so nothing is first found broken on a GPU.
set -uo pipefail
smoke=0
scale=1 # x5 with --smoke: a loaded CPU is slower than a GPU, and the limits are not what it tests
if [ "${1:-}" = "--smoke" ]; then
    smoke=1
    scale=5
    shift
fi
out=${1:-runs/cuda}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
failed=0

# part NAME SECONDS COMMAND...: one part under its own limit, its output in OUT_DIR/NAME.txt.
part() {
    local name=$1 limit=$2
    shift 2
    timeout $((limit * scale)) "$@" >"$out/$name.txt" 2>&1
    local rc=$?
    echo "$name: exit $rc (limit $((limit * scale)) s)" | tee -a "$out/summary.txt"
    [ "$rc" -eq 0 ] || failed=1
}

: >"$out/summary.txt"
if [ "$smoke" = 1 ]; then
    device=cpu
    throughput=(--episodes 4 --eval-batch 2 --repeats 1 --backbones conv4 --no-synthetic)
    ehg=(--backbones conv4 --heads protonet --shots 1 --resplits 1,2 --repeats 1)
    precision=(--backbones conv4 --heads protonet --repeats 1 --no-eval --no-synthetic)
    adaptation=(--methods anil maml --batch 2 --query 2 --repeats 1)
else
    device=cuda
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt"
    throughput=(--backbones conv4,resnet12 --heads protonet,ridge,svm)
    ehg=(--repeats 3)
    precision=(--episodes 2000)
    adaptation=()
fi
"$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
    >>"$out/summary.txt"
part pytest_cuda 60 "$python" -m pytest -q -p no:cacheprovider tests/test_cuda.py \
    tests/test_augment.py
part bench_throughput 90 "$python" -m benchmarks.bench_throughput --device "$device" \
    "${throughput[@]}"
part bench_ehg 45 "$python" -m benchmarks.bench_ehg --device "$device" "${ehg[@]}"
part bench_precision 90 "$python" -m benchmarks.bench_precision --device "$device" \
    "${precision[@]}"
part bench_adaptation 30 "$python" -m benchmarks.bench_adaptation --device "$device" \
    "${adaptation[@]}"
if [ -d ../shared/reference ] && [ "$smoke" = 0 ]; then
    for backbone in conv4 resnet12; do
        part "bench_vs_metaoptnet_$backbone" 45 "$python" -m benchmarks.bench_vs_metaoptnet \
            --amp off -- --device cuda --backbone "$backbone"
    done
fi
exit "$failed"
