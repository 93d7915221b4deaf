#!/usr/bin/env bash
# The checks that need a GPU, in one run: the CUDA tests, then the throughput, EHG and precision
# benchmarks on CUDA (float32 against bf16: the measurement that decides --amp auto on GPUs), and
# the MetaOptNet side-by-side when the shared reference folder is beside the repository. Usage, from the repository root: bash benchmarks/cuda_checks.sh [OUT_DIR]  (logs go to
# OUT_DIR, default runs/cuda); fewshot must be importable by $PYTHON (default python3):
# pip install -e . or PYTHONPATH.
set -uo pipefail
out=${1:-runs/cuda}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
"$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$out/gpu.txt"
timeout 120 "$python" -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_augment.py 2>&1 \
    | tee "$out/pytest_cuda.txt"
timeout 200 "$python" -m benchmarks.bench_throughput --device cuda --backbones conv4,resnet12 \
    --heads protonet,ridge,svm 2>&1 | tee "$out/bench_throughput_cuda.txt"
timeout 120 "$python" -m benchmarks.bench_ehg --device cuda --repeats 3 2>&1 | tee "$out/bench_ehg_cuda.txt"
timeout 200 "$python" -m benchmarks.bench_precision --device cuda --episodes 2000 2>&1 \
    | tee "$out/bench_precision_cuda.txt"
for backbone in conv4 resnet12; do
    timeout 100 "$python" -m benchmarks.bench_vs_metaoptnet --amp off -- --device cuda \
        --backbone "$backbone" 2>&1 | tee "$out/bench_vs_metaoptnet_cuda_$backbone.txt"
done
