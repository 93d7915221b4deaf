#!/usr/bin/env bash
# The checks that need a GPU, in one run of under 10 minutes (the parts' limits add up to 590
# s, the training runs of every method counted once: they run at once), every figure under
# OUT_DIR: the CUDA tests, the throughput, EHG, precision (float32 against bf16: the measurement
# behind --amp auto on GPUs) and MAML-family benchmarks, a few steps of `fewshot train` for
# every method and head with their CUDA defaults (Matching and Relation Networks among them),
# `fewshot pretrain` and two test-time classifiers on its features, the Omniglot trainval
# ProtoNet trained end to end and evaluated, the SVM head's solvers side by side, the iterative
# test-time classifiers (20-way PT-MAP among them), P>M>F's fine-tuning one episode at a
# time against a batch at once, and the training step eager and through torch.compile (--compile,
# CUDA graphs among its modes). Each part has its own time limit, so a slow part cannot starve
# the others; summary.txt gives each part's exit status and seconds. The MetaOptNet side-by-side
# (benchmarks/bench_vs_metaoptnet.py, measured on an H200 on 2026-11-28) runs by its own command.
#
# Usage, from the repository root: bash benchmarks/cuda_checks.sh [--smoke] [OUT_DIR]
# (default OUT_DIR runs/cuda; fewshot importable by $PYTHON, default python3). --smoke runs every
# part on the CPU at tiny sizes, one after the other and without time limits: a test of this
# script, so nothing is first found broken on a GPU.
set -uo pipefail
smoke=0
if [ "${1:-}" = "--smoke" ]; then
    smoke=1
    shift
fi
out=${1:-runs/cuda}
mkdir -p "$out"
runs=$(mktemp -d) # the training runs' folders: checkpoints are not figures
trap 'rm -rf "$runs"' EXIT
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

# part NAME SECONDS COMMAND...: one part under its own limit, its output in OUT_DIR/NAME.txt.
# With --smoke no limit: the CPU run checks exit statuses, and a loaded CPU's times say nothing.
part() {
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    if [ "$smoke" = 1 ]; then
        "$@" >"$out/$name.txt" 2>&1
        rc=$?
        limit="no limit"
    else
        timeout "$limit" "$@" >"$out/$name.txt" 2>&1
        rc=$?
        limit="limit $limit s"
    fi
    echo "$name: exit $rc ($limit, took $((SECONDS - start)) s)" | tee -a "$out/summary.txt"
}

# together COMMAND...: at once with the other training parts on a GPU; in turn on the CPU, so
# that the smoke run beside the test suite holds one training process at a time.
together() {
    if [ "$smoke" = 1 ]; then
        "$@"
    else
        "$@" &
    fi
}

: >"$out/summary.txt"
if [ "$smoke" = 1 ]; then
    device=cpu
    # The CUDA tests (all skipped here: the part's check is that they collect and run); the
    # augmentation tests run in the suite on the CPU already.
    cuda_tests=(tests/test_cuda.py)
    throughput=(--episodes 4 --eval-batch 2 --repeats 1 --backbones conv4 --no-synthetic
        --eval-classes 40 --query 2)
    ehg=(--backbones conv4 --heads protonet --shots 1 --resplits 1,2 --repeats 1 --query 2)
    # 20 classes: bf16, emulated on a CPU without it, embeds them at a tenth of float32's speed.
    precision=(--backbones conv4 --heads protonet --repeats 1 --no-synthetic --query 2
        --episodes 16 --eval-classes 20)
    adaptation=(--smoke)
    steps=(--query 2 --episodes-per-epoch 2 --val-episodes 2)
    trainval=(--epochs 1 --episodes-per-epoch 2 --val-episodes 2)
    episodes=16
    svm=(--cases 3w2s2q/16 --episodes 2 --repeats 1)
    classifiers=(--smoke)
    pmf=(--smoke)
    compile=(--smoke --modes off,default)
    # The 688 validation classes (embedding the 1692 test classes took most of the two
    # classifiers' parts), and few enough episodes that embedding each one costs less.
    classifier_eval=(--split val --episodes 16 --episodes-per-batch 8)
else
    device=cuda
    cuda_tests=(tests/test_cuda.py tests/test_augment.py)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt"
    throughput=(--backbones conv4,resnet12 --heads protonet,ridge,svm)
    # U = 1 and 5 only: the full grid ran past its limit on an H200 (mostly per-row set-up).
    ehg=(--resplits 1,5 --repeats 3)
    precision=(--episodes 2000)
    adaptation=()
    steps=(--episodes-per-epoch 4 --val-episodes 16)
    trainval=()
    episodes=2000
    svm=()
    classifier_eval=(--episodes 200 --episodes-per-batch 100)
    # The goal of the issue of speed: 2000 twenty-way PT-MAP episodes in under 10 s.
    classifiers=(--way 20 --goal 10)
    # 64 episodes of 20 steps, to fit the part's limit (the GPU times are not measured yet).
    pmf=(--episodes 64 --steps 20)
    # Every mode: reduce-overhead replays CUDA graphs (the launch-bound Conv-4 step).
    compile=(--steps 50 --repeats 3)
fi
"$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
    >>"$out/summary.txt"
part pytest_cuda 30 "$python" -m pytest -q -p no:cacheprovider "${cuda_tests[@]}"
part bench_throughput 40 "$python" -m benchmarks.bench_throughput --device "$device" \
    "${throughput[@]}"
part bench_ehg 40 "$python" -m benchmarks.bench_ehg --device "$device" "${ehg[@]}"
part bench_precision 35 "$python" -m benchmarks.bench_precision --device "$device" \
    "${precision[@]}"
part bench_adaptation 25 "$python" -m benchmarks.bench_adaptation --device "$device" \
    "${adaptation[@]}"
# Every method and head for a few steps and a validation on the shipped Omniglot, with the
# defaults it has on this device (no memory-format flag; anil also in channels_last, which it
# accepts): each is a check of its exit status, not a timing.
train() {
    local name=$1
    shift
    part "train_$name" 40 "$python" -m fewshot train --dataset omniglot --epochs 1 \
        --device "$device" --out "$runs/$name" "${steps[@]}" "$@"
}
for head in protonet ridge svm; do
    together train "embedding_$head" --method embedding --head "$head"
done
for method in maml fomaml anil imaml matching relation; do
    together train "$method" --method "$method"
done
together train anil_channels_last --method anil --channels-last
wait
# Pretraining with its defaults (one pass over the 688 validation classes' images, a stand-in
# for the train split's 82k), then its frozen features under two test-time classifiers.
part pretrain 25 "$python" -m fewshot pretrain --dataset omniglot --train-split val \
    --val-split test --epochs 1 --batch-size 256 --val-episodes 16 --device "$device" \
    --out "$runs/pretrain"
for classifier in logistic pt-map; do
    part "eval_$classifier" 20 "$python" -m fewshot eval --checkpoint "$runs/pretrain/last.pt" \
        --classifier "$classifier" --device "$device" "${classifier_eval[@]}" \
        --out "$out/eval_$classifier.json"
done
# The zoo's trainval ProtoNet end to end (the last GPU run, in float32: 76 s), then its last
# checkpoint on 2000 seeded 5-way 1-shot test episodes (98.73 %; the CPU model's 98.75 %).
part train_trainval 110 "$python" -m fewshot train \
    --config models/omniglot/protonet_conv4_trainval.json --device "$device" \
    --out "$runs/trainval" "${trainval[@]}"
part eval_trainval 20 "$python" -m fewshot eval --checkpoint "$runs/trainval/last.pt" \
    --way 5 --shot 1 --episodes "$episodes" --seed 0 --device "$device" \
    --out "$out/eval_trainval.json"
part bench_svm 30 "$python" -m benchmarks.bench_svm --device "$device" "${svm[@]}"
part bench_classifiers 40 "$python" -m benchmarks.bench_classifiers --device "$device" \
    "${classifiers[@]}"
part bench_pmf 25 "$python" -m benchmarks.bench_pmf --device "$device" "${pmf[@]}"
# Each mode compiles on its first step (a cold cache: tens of seconds on a GPU).
part bench_compile 90 "$python" -m benchmarks.bench_compile --device "$device" "${compile[@]}"
# Background parts cannot set a variable here: the summary is the record of every exit status.
if grep -q ': exit [^0]' "$out/summary.txt"; then
    exit 1
fi
