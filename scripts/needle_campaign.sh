#!/bin/bash
# The RidgeFill needle campaign (>= 200 paired trials, off vs quality), in pieces
# that can go on across machines and sessions.
#
# `eval needle --results FILE` refuses a file written by another binary (its header holds
# the binary's hash), and a build with CUDA is not reproducible (nvcc names its temporary
# files by process id inside the objects). So the campaign binary is built here WITHOUT CUDA
# from a fixed commit, which gives the same bytes on every Debian 12 machine with the same
# compiler, and the results file lives in the repo (scripts/data/), so a later session rebuilds
# the binary, copies the file out and runs the missing trials.
#
# usage: scripts/needle_campaign.sh [--qwen|--group] WORKDIR [BUDGET_SECONDS]
#   --qwen   the campaign on Qwen2.5-Coder-1.5B:
#            its own binary, seed and results file (scripts/data/needle-q15-t2048-s18.jsonl)
#   --group  grouped attention to filled rows (--fill-group 16),
#            SmolLM2, one distractor fact per prompt: scripts/data/needle-g16-d1-s21.jsonl
#   WORKDIR  where the binary is built and the run happens (outside the repo; reused; one per
#            campaign)
#   BUDGET   stop starting new trials after this many seconds (default: no limit)
# Then copy WORKDIR/needle.jsonl back over the campaign's file in scripts/data/ and commit it.
#
# Needs the model (`ridgekv pull`, `ridgekv pull qwen2.5-coder-1.5b`) and its maps (`ridgekv
# prepare [-m MODEL]`): the file's header names the maps by hash; maps fitted on another machine
# must hash the same (the fit is deterministic for a given binary and thread count) or the file
# is refused, naming it.
set -euo pipefail
EXTRA=()
REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/ridgekv
if [ "${1:-}" = --qwen ]; then
    shift
    COMMIT=6d69a18 # the Qwen campaign binary's commit
    FILE=scripts/data/needle-q15-t2048-s18.jsonl
    MODEL=$CACHE/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    MAPGLOB=qwen2-
    TRIALS=200 SEED=18
elif [ "${1:-}" = --group ]; then
    shift
    COMMIT=d9cc927 # the grouped campaign binary's commit
    FILE=scripts/data/needle-g16-d1-s21.jsonl
    MODEL=$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf
    MAPGLOB=llama-
    TRIALS=200 SEED=21 EXTRA=(--fill-group 16 --distractors 1)
else
    COMMIT=84c51e2 # the campaign binary's commit (sha256 3c4517b6... of build/cli/ridgekv)
    FILE=scripts/data/needle-q-t2048-s11.jsonl
    MODEL=$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf
    MAPGLOB=llama-
    TRIALS=220 SEED=11
fi
WORK=${1:?usage: scripts/needle_campaign.sh [--qwen|--group] WORKDIR [BUDGET_SECONDS]}
BUDGET=${2:-0}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
if [ ! -x "$WORK/src/build/cli/ridgekv" ]; then
    rm -rf "$WORK/src"
    git -C "$REPO" worktree add -f --detach "$WORK/src" "$COMMIT" >/dev/null
    (cd "$WORK/src" && meson setup build --buildtype=release -Dcuda=disabled -Dtests=false >/dev/null &&
        ninja -C build cli/ridgekv >/dev/null)
fi
B=$WORK/src/build/cli/ridgekv
MAPS=$(ls "$CACHE"/maps/$MAPGLOB*.maps.gguf 2>/dev/null | head -1 || true)
[ -f "$MODEL" ] || { echo "needle_campaign: no $MODEL (run: ridgekv pull, or for --qwen: ridgekv pull qwen2.5-coder-1.5b)" >&2; exit 1; }
[ -n "$MAPS" ] || { echo "needle_campaign: no maps in $CACHE/maps (run: ridgekv prepare)" >&2; exit 1; }
# a campaign whose file is not in the repo yet starts empty
[ -f "$WORK/needle.jsonl" ] || [ ! -f "$REPO/$FILE" ] || cp "$REPO/$FILE" "$WORK/needle.jsonl"
# the binary reads its own hash from /proc/self/exe: run this copy, not another one
ARGS=(eval needle -m "$MODEL" --corpus "$REPO/../shared/corpus" --ridgefill "$MAPS" --fill off,quality --tail 2048
    --lengths 3072,4096,6144,8000 --depths 0.1,0.3,0.5,0.7,0.9 --trials "$TRIALS" --seed "$SEED" -t 2
    --results "$WORK/needle.jsonl" "${EXTRA[@]}")
[ "$BUDGET" != 0 ] && ARGS+=(--budget "$BUDGET")
"$B" "${ARGS[@]}"
[ -f "$WORK/needle.jsonl" ] && echo "needle_campaign: copy $WORK/needle.jsonl to $REPO/$FILE and commit it" >&2
