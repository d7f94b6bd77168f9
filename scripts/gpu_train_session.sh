#!/usr/bin/env bash
# Training the heads at scale (issue 14) over several H200 sessions, one step per device call (< 10 min each).
# First, in every session: scripts/gpu_session.sh stage-a, stage-b, stage-c (model, gguf wheel, data).
#   scripts/gpu_train_session.sh stage-in     unpack what the last session sent back (carry .gpu-stage: bundle
#                                             parts of the corpus shards and of the packed run) into /root
#   scripts/gpu_train_session.sh corpus       answer training prompts for GEN_MINUTES into /root/corpus; the new
#                                             shards go back as a bundle (parts in $OUT, the rest via `send`)
#   scripts/gpu_train_session.sh train        train /root/run (fresh or staged) for TRAIN_MINUTES; back come the
#                                             report, plots, log and the packed run (bf16 weights, no moments)
#   scripts/gpu_train_session.sh send         the next bundle parts that did not fit in an earlier call's $OUT
#   scripts/gpu_train_session.sh eval-tokens  tau against training tokens (snapshots + final heads), exact replay
#   scripts/gpu_train_session.sh ablate       tau and real-loop cost of the heads of /root/run-ablation
#   scripts/gpu_train_session.sh heads        the final heads of /root/run (int8, as they ship) as one tar
# Knobs (environment): GEN_MINUTES GEN_BATCH GEN_SHARDS GEN_ARGS GEN_SEND; TRAIN_MINUTES TRAIN_HEADS TRAIN_ARGS RUN PACK (0: no
# packed run back, for a train call that another train call of the same session follows); EVAL_MINUTES
# EVAL_N EVAL_PARALLEL; ROOT (default /root) and DEVICE (default cuda) let the whole flow be rehearsed on a CPU
# (tests/train/test_gpu_train_session.py) with GEN_ARGS/TRAIN_ARGS for a tiny random target. On this machine afterwards: `python scripts/bundle.py unpack FILES_AT --to .gpu-results`
# rebuilds corpus/ and run/ there; copy the parts of whatever the next session needs into .gpu-stage/.
set -uo pipefail
ROOT=${ROOT:-/root}
DEVICE=${DEVICE:-cuda}
export PYTHONPATH=$ROOT/site:$PWD PYTHONUNBUFFERED=1 SPECBENCH_CACHE=${SPECBENCH_CACHE:-$ROOT/cache}
export SPECBENCH_SMOLLM2_GGUF=${SPECBENCH_SMOLLM2_GGUF:-$ROOT/stage/smollm2.gguf} SPECBENCH_DATA=${SPECBENCH_DATA:-$ROOT/data}
step=${1:?step}
HERE=$PWD/scripts
RUN=${RUN:-$ROOT/run}
CORPUS=$ROOT/corpus
SPOOL=$ROOT/spool
t0=$(date +%s)
since() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
bundle() { python3 "$HERE/bundle.py" "$@"; }
send_rest() { bundle send --spool $SPOOL --to "$OUT" --max-files 8 --max-mib 60; }
mkdir -p "$ROOT"
secs() { python3 -c "print(int(float('$1') * 60 + $2))"; }  # minutes + slack -> a timeout in seconds

case "$step" in
  stage-in)
    bundle unpack .gpu-stage --to $ROOT/in --parts $ROOT/parts
    if compgen -G "$ROOT/in/corpus/shard-*.npz" > /dev/null; then
      python3 -m specbench.cli corpus add $CORPUS $ROOT/in/corpus && rm -rf $ROOT/in/corpus
    fi
    if [ -f $ROOT/in/run/trainer_state.pt ]; then rm -rf "$RUN"; mv $ROOT/in/run "$RUN"; fi
    [ -d $ROOT/in/snapshots ] && mkdir -p "$RUN/snapshots" && cp -r $ROOT/in/snapshots/. "$RUN/snapshots/" && rm -rf $ROOT/in/snapshots
    [ -d $CORPUS ] && python3 -m specbench.cli corpus status $CORPUS
    [ -f "$RUN/run.json" ] && python3 -c "import json; r = json.load(open('$RUN/run.json')); print('run at step', r['step'], 'of', r['total_steps'], '-', r['tokens_seen'], 'response tokens')"
    since done ;;
  corpus)
    before=$(ls $CORPUS/shard-*.npz 2>/dev/null | sort)
    timeout $(secs "${GEN_MINUTES:-8.5}" 60) python3 -m specbench.cli corpus generate --out $CORPUS --device $DEVICE \
      --data $SPECBENCH_DATA --gen-batch "${GEN_BATCH:-512}" --shard-size "${GEN_SHARD_SIZE:-1024}" --minutes "${GEN_MINUTES:-8.5}" \
      ${GEN_SHARDS:+--shards $GEN_SHARDS} ${GEN_ARGS:-} 2>&1 | tee $ROOT/corpus_gen.log | grep -v "^corpus: shard .* batch" | tail -20
    grep "^corpus: shard .* batch" $ROOT/corpus_gen.log | tail -3
    new=$(comm -13 <(echo "$before") <(ls $CORPUS/shard-*.npz 2>/dev/null | sort) | xargs -r -n1 basename)
    if [ -n "$new" ] && [ "${GEN_SEND:-1}" = 1 ]; then  # GEN_SEND=0: the shards stay on this machine only
      name="shards-$(echo $new | tr ' ' '\n' | head -1 | tr -dc 0-9)-$(echo $new | tr ' ' '\n' | tail -1 | tr -dc 0-9)"
      bundle pack "$name" $(for f in $new; do echo corpus/$f; done) --spool $SPOOL --base $ROOT
    fi
    python3 -m specbench.cli corpus status $CORPUS | tee "$OUT/corpus_status.txt"
    cp $ROOT/corpus_gen.log "$OUT/corpus_gen.log"
    send_rest
    since done ;;
  train)
    args=${TRAIN_ARGS:---epochs 2 --schedule wsd --batch-size 16 --max-len 640 --val-every 500 --val-tau-every 2000 --snapshot-tokens 0.4M,2M,8M --save-every 500}
    [ -f "$RUN/trainer_state.pt" ] && since "resuming $RUN" || since "fresh run in $RUN"
    snaps_before=$(ls -d "$RUN"/snapshots/tok* 2>/dev/null | sort)
    timeout $(secs "${TRAIN_MINUTES:-8}" 90) python3 -m specbench.cli train --device $DEVICE --corpus $CORPUS --out "$RUN" \
      --drafter "${TRAIN_HEADS:-dflash,jetspec,jetspec-tree,eagle3}" --minutes "${TRAIN_MINUTES:-8}" --quiet $args 2>&1 | tail -15
    python3 -m specbench.cli train-report "$RUN" --plots $ROOT/plots | tee "$OUT/train_report.txt"
    tar -czf "$OUT/plots.tgz" -C $ROOT plots
    gzip -c "$RUN/train_log.jsonl" > "$OUT/train_log.jsonl.gz"
    [ "${PACK:-1}" = 1 ] && rm -rf $ROOT/pack $SPOOL/run-* && python3 -m specbench.cli train-pack "$RUN" $ROOT/pack/run && \
    bundle pack "run-$(python3 -c "import json; print(json.load(open('$RUN/run.json'))['step'])")" run --spool $SPOOL --base $ROOT/pack
    for s in $(comm -13 <(echo "$snaps_before") <(ls -d "$RUN"/snapshots/tok* 2>/dev/null | sort)); do
      mkdir -p $ROOT/snap/snapshots && rm -rf $ROOT/snap/snapshots/* && cp -r "$s" $ROOT/snap/snapshots/
      bundle pack "snapshot-$(basename $s)" snapshots --spool $SPOOL --base $ROOT/snap
    done
    send_rest
    since done ;;
  send)
    send_rest ;;
  eval-tokens)
    R=$ROOT/results/tau_tokens; mkdir -p $R
    [ -f .gpu-results/tau_tokens.jsonl ] && [ ! -f $R/tau.jsonl ] && cp .gpu-results/tau_tokens.jsonl $R/tau.jsonl
    timeout $(secs "${EVAL_MINUTES:-8}" 60) python3 scripts/tau_vs_tokens.py --run "$RUN" --data $SPECBENCH_DATA \
      --out $R/tau.jsonl --n "${EVAL_N:-50}" --plot "$OUT/tau_vs_tokens.png" --device $DEVICE --target smollm2-135m \
      --parallel "${EVAL_PARALLEL:-12}" --ref-batch 4 --minutes "${EVAL_MINUTES:-8}" 2>&1 | grep -v "tau_table: [0-9]" | tail -60 \
      | tee "$OUT/tau_vs_tokens.txt"
    cat $R/tau.jsonl $R/tau.shard*.jsonl 2>/dev/null | gzip > "$OUT/tau_tokens_rows.jsonl.gz"
    since done ;;
  ablate)
    R=$ROOT/results/ablation; mkdir -p $R
    timeout $(secs "${EVAL_MINUTES:-6}" 180) python3 scripts/ablation_table.py --run "${RUN_ABLATION:-$ROOT/run-ablation}" \
      --data $SPECBENCH_DATA --out $R --n "${EVAL_N:-30}" --device $DEVICE --parallel "${EVAL_PARALLEL:-12}" --ref-batch 4 \
      --minutes "${EVAL_MINUTES:-6}" 2>&1 | grep -v "tau_table: [0-9]" | tail -60 | tee "$OUT/ablation.txt"
    tar -czf "$OUT/ablation.tgz" -C $ROOT/results ablation
    since done ;;
  heads)
    tar -cf "$OUT/heads.tar" -C "$RUN" heads && ls -la "$OUT" ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
