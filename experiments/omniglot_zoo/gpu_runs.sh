#!/usr/bin/env bash
# The zoo's long runs, a slice at a time: every named config of models/omniglot/ trains at once
# for SECONDS, each resumed from RUNS/NAME/last.pt where an earlier slice left one, then is
# stopped with SIGINT (the trainer saves last.pt at the next step and exits 130; 0 when the
# schedule ended first). Each run's small files (checkpoints, metrics, settings) and its slices'
# logs go into OUT/NAME.tar, to bring back and unpack into RUNS before the next slice: a run
# split over many slices is one run, as --resume continues it where it stopped. OUT holds one
# file per run and summary.txt (a device call brings back 8 files: seven Conv-4 runs).
#
# Usage, from the repository root:
#   bash experiments/omniglot_zoo/gpu_runs.sh SECONDS OUT [RUNS [NAME...]]
# RUNS default runs/zoo; NAMEs default: the configs the reproduction table waits for; $DEVICE
# default cuda; fewshot importable by $PYTHON, default python3.
set -uo pipefail
if [ $# -lt 2 ]; then
    echo "usage: bash $0 SECONDS OUT [RUNS [NAME...]]" >&2
    exit 2
fi
seconds=$1 out=$2 runs=${3:-runs/zoo}
shift $(($# < 3 ? $# : 3))
names=("$@")
if [ ${#names[@]} = 0 ]; then
    # The 5-way MAML models first (the table's largest gaps), then 20-way shapes with no
    # model yet.
    names=(maml_conv4_5way1shot maml_conv4_5way5shot fomaml_conv4_5way1shot
        imaml_conv4_5way1shot maml_conv4_20way1shot fomaml_conv4_20way1shot
        imaml_conv4_20way1shot)
fi
python=${PYTHON:-python3} device=${DEVICE:-cuda}
for name in "${names[@]}"; do
    if [ ! -f "models/omniglot/$name.json" ]; then
        echo "no config models/omniglot/$name.json" >&2
        exit 2
    fi
done
mkdir -p "$out" "$runs"
"$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
    >"$out/summary.txt"

# epochs_done NAME: the epochs the run's metrics log holds.
epochs_done() {
    local log="$runs/$1/metrics.jsonl"
    if [ -f "$log" ]; then wc -l <"$log" | tr -d ' '; else echo 0; fi
}

# slice NAME: one run's slice, resumed if it has a checkpoint, else started afresh (--overwrite:
# files of a slice stopped before its first checkpoint); a run that does not stop within a
# minute of SIGINT is killed.
slice() {
    local name=$1 start=$SECONDS rc args=(--config "models/omniglot/$1.json" --out "$runs/$1")
    args+=(--overwrite)
    [ -f "$runs/$name/last.pt" ] && args=(--resume "$runs/$name/last.pt")
    timeout --preserve-status -s INT -k 60 "$seconds" "$python" -m fewshot train --device "$device" "${args[@]}" \
        >"$out/$name.txt" 2>&1
    rc=$?
    echo "$name: exit $rc after $((SECONDS - start)) s, $(epochs_done "$name") epochs logged;" \
        "$(tr '\r' '\n' <"$out/$name.txt" | grep -v '^ *$' | tail -n 1)" >>"$out/summary.txt"
}

for name in "${names[@]}"; do
    slice "$name" &
done
wait
# The small files only: a feature cache or TensorBoard events stay behind.
for name in "${names[@]}"; do
    mkdir -p "$runs/$name" # also for a run refused before it made its folder
    cat "$out/$name.txt" >>"$runs/$name/slices.log" && rm "$out/$name.txt"
    (cd "$runs" && find "$name" -maxdepth 1 -type f \
        \( -name '*.pt' -o -name '*.json' -o -name '*.jsonl' -o -name slices.log \) -print0 |
        tar --null -cf - -T -) >"$out/$name.tar"
done
cat "$out/summary.txt"
