#!/usr/bin/env bash
# One session's GPU work as a background pipeline that keeps the GPU busy between device calls, while
# the calls only wait and collect (the device runs on between calls as long as the next one comes within
# its idle window). After scripts/gpu_session.sh stage-a, stage-b, stage-c:
#   scripts/gpu_pipeline.sh start      launch the phases below detached (setsid) and return
#   scripts/gpu_pipeline.sh collect S  wait up to S seconds (or until the pipeline ends), then move the
#                                      finished bundles that fit into $OUT and print the log's tail
# Phases (each bounded; deadlines in minutes from the start, so the whole run ends by PIPE_END):
#   corpus   scripts/gpu_train_session.sh corpus for GEN_MINUTES (issue 14's resumable shards)
#   train    all five heads on that corpus, one run: a probe of PROBE_STEPS measures the step time, then the
#            run is rescheduled (wsd) to end by TRAIN_END; the state at the start of the decay is packed
#            (a later session resumes it with --reschedule), the decayed heads are the result
#   eval     the new heads installed as the shipped ones, then: foresight GPU tests, recorded rounds and
#            calibration (foresight_hits), Table 3 (foresight_table) at chain:16 and ddtree:64, the
#            per-stage round table of every drafter, each cut by its own timeout
# Results go back as bundles (scripts/bundle.py), oldest first: corpus, heads + reports, eval, run.
set -uo pipefail
ROOT=${ROOT:-/root}
export PYTHONPATH=$ROOT/site:$PWD PYTHONUNBUFFERED=1 SPECBENCH_CACHE=${SPECBENCH_CACHE:-$ROOT/cache}
export SPECBENCH_SMOLLM2_GGUF=${SPECBENCH_SMOLLM2_GGUF:-$ROOT/stage/smollm2.gguf} SPECBENCH_DATA=${SPECBENCH_DATA:-$ROOT/data}
DEVICE=${DEVICE:-cuda}; DTYPE=${DTYPE:-bfloat16}; TARGET=${TARGET:-smollm2-135m}
P=$ROOT/pipe; SPOOL=$ROOT/spool; RUN=$ROOT/run
step=${1:?step}
bundle() { python3 scripts/bundle.py "$@"; }
now() { date +%s; }
log() { echo "[pipe $(( $(now) - $(cat $P/t0) ))s] $*"; }
left() { echo $(( $(cat $P/t0) + $1 - $(now) )); }  # seconds until second $1 of the pipeline

run_pipeline() {
  log "corpus for ${GEN_MINUTES:-5} min"
  GEN_MINUTES=${GEN_MINUTES:-5} bash scripts/gpu_train_session.sh corpus > $P/corpus.txt 2>&1
  tail -25 $P/corpus.txt; touch $P/corpus.done
  HEADS=${TRAIN_HEADS:-dflash,jetspec,jetspec-tree,eagle3,jetspec++}
  common="--device $DEVICE --corpus $ROOT/corpus --out $RUN --drafter $HEADS --schedule wsd --batch-size ${BATCH:-16} \
    --max-len ${MAX_LEN:-640} --val-every ${VAL_EVERY:-250} --val-tau-every 0 --save-every 100000 --quiet ${TRAIN_EXTRA:-}"
  log "train probe: ${PROBE_STEPS:-40} steps"
  python3 -m specbench.cli train $common --steps 100000 --until-step ${PROBE_STEPS:-40} > $P/train_probe.txt 2>&1
  tail -5 $P/train_probe.txt
  secs=$(left ${TRAIN_END_S:-930})
  total=$(python3 - "$RUN" "$secs" "${PROBE_STEPS:-40}" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/train_log.jsonl") if '"kind": "val"' not in l and '"kind":"val"' not in l]
rows = [r for r in rows if "step" in r and "time" in r]
a, b = rows[len(rows) // 2], rows[-1]  # past the first steps' compile/warm-up
rate = (b["step"] - a["step"]) / max(1e-6, b["time"] - a["time"])
print(f"probe: {rate:.2f} steps/s", file=sys.stderr)
print(int(sys.argv[3]) + max(50, int(0.92 * rate * (float(sys.argv[2]) - 45))))
EOF
)
  decay_at=$(python3 -c "print(int($total - round(0.2 * $total)))")
  log "train: rescheduled to $total steps (decay from step $decay_at), $secs s left"
  python3 -m specbench.cli train $common --steps $total --reschedule --until-step $decay_at > $P/train_stable.txt 2>&1
  tail -8 $P/train_stable.txt
  rm -rf $ROOT/pack && python3 -m specbench.cli train-pack "$RUN" $ROOT/pack/run > $P/pack.txt 2>&1; cat $P/pack.txt
  python3 -m specbench.cli train $common --steps $total > $P/train_decay.txt 2>&1
  tail -12 $P/train_decay.txt
  python3 -m specbench.cli train-report "$RUN" --plots $P/results/plots > $P/results/train_report.txt 2>&1
  cat $P/results/train_report.txt
  cp $RUN/train_log.jsonl $P/results/ 2>/dev/null; cp $P/*.txt $P/results/ 2>/dev/null
  mkdir -p $P/heads && cp -r $RUN/heads/. $P/heads/
  [ -d $RUN/snapshots ] && cp -r $RUN/snapshots $P/heads/ 2>/dev/null
  bundle pack heads heads --spool $SPOOL --base $P --chunk-mib 14
  bundle pack train-results results --spool $SPOOL --base $P
  log "train done"; touch $P/train.done

  # eval: the new heads are the shipped ones for this copy
  for h in dflash jetspec jetspec-tree eagle3; do
    [ -d $RUN/heads/$h ] && rm -rf specbench/heads/$h-smollm2-135m && mkdir -p specbench/heads/$h-smollm2-135m && \
      cp -r $RUN/heads/$h/. specbench/heads/$h-smollm2-135m/
  done
  JPP=$RUN/heads/jetspec++; E=$P/eval; mkdir -p $E
  log "foresight GPU tests"
  timeout 150 python3 -m pytest -m gpu tests/gpu/test_foresight_cuda.py -q -p no:cacheprovider > $E/gpu_tests.txt 2>&1
  tail -5 $E/gpu_tests.txt
  log "foresight_hits: recorded rounds + calibration"
  timeout ${HITS_TIMEOUT:-130} python3 scripts/foresight_hits.py --data $SPECBENCH_DATA --head $JPP --device $DEVICE --dtype float32 \
    --target $TARGET --tree chain:16 --datasets gsm8k,math500 --n ${HITS_N:-6} --max-new-tokens 128 --minutes ${HITS_MINUTES:-1.3} \
    --out $E/hits > $E/hits.txt 2>&1
  tail -40 $E/hits.txt
  cal=""; [ -f $E/hits/calibration.json ] && cal="--calibration $E/hits/calibration.json"
  for tree in chain:16 ddtree:64; do
    [ $(left ${PIPE_END_S:-1320}) -lt 60 ] && { log "no time for the $tree table"; continue; }
    log "foresight_table $tree"
    timeout $(( $(left ${PIPE_END_S:-1320}) > 200 ? 200 : $(left ${PIPE_END_S:-1320}) )) python3 scripts/foresight_table.py \
      --data $SPECBENCH_DATA --device $DEVICE --dtype $DTYPE --target $TARGET --head $JPP $cal --tree $tree --n ${FS_N:-5} \
      --max-new-tokens 256 --out $E/table_${tree%%:*}.jsonl > $E/table_${tree%%:*}.txt 2>&1
    grep -v "^foresight_table:" $E/table_${tree%%:*}.txt | tail -20
  done
  if [ $(left ${PIPE_END_S:-1320}) -gt 120 ]; then
    log "round table (new heads)"
    timeout $(left ${PIPE_END_S:-1320}) python3 -m specbench.cli run experiments/round_table.py --device $DEVICE --dtype $DTYPE \
      --data-dir $SPECBENCH_DATA --out $E/round_table > $E/round_table.txt 2>&1
    tail -25 $E/round_table.txt
  fi
  bundle pack eval eval --spool $SPOOL --base $P
  bundle pack run run --spool $SPOOL --base $ROOT/pack --chunk-mib 14
  log "pipeline done"
  touch $P/done
}

case "$step" in
  start)
    rm -rf $P && mkdir -p $P/results && now > $P/t0
    setsid nohup bash "$0" run > $P/log 2>&1 < /dev/null &
    sleep 2; cat $P/log ;;
  run)
    OUT=$ROOT/out-corpus; mkdir -p $OUT; export OUT  # the corpus step's own send goes here, then to the spool
    run_pipeline
    ;;
  collect)  # collect SECONDS [MARKER: corpus | train | all]
    end=$(( $(now) + ${2:-540} )); mark=$P/${3:-all}.done; [ "${3:-all}" = all ] && mark=$P/done
    while [ $(now) -lt $end ] && [ ! -f $mark ] && [ ! -f $P/done ]; do sleep 3; done
    [ -d $ROOT/out-corpus ] && for f in $ROOT/out-corpus/*; do [ -f "$f" ] && mv "$f" "$OUT/"; done
    bundle send --spool $SPOOL --to "$OUT" --max-files 8 --max-mib 62
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
    tail -${LINES_BACK:-70} $P/log; ls -la "$OUT" ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
