#!/usr/bin/env bash
# One session's GPU work as a background pipeline that keeps the GPU busy between device calls, while
# the calls only wait and collect (the device runs on between calls as long as the next one comes within
# its idle window). After scripts/gpu_session.sh stage-a, stage-b, stage-c:
#   scripts/gpu_pipeline.sh start      launch the phases below detached (setsid) and return
#   scripts/gpu_pipeline.sh collect S  wait up to S seconds (or until the pipeline ends), then move the
#                                      finished bundles that fit into $OUT and print the log's tail
# PHASES (default "corpus train eval"), in order, each bounded by its deadline (seconds from the start):
#   corpus   scripts/gpu_train_session.sh corpus for GEN_MINUTES (issue 14's resumable shards)
#   train    TRAIN_HEADS on that corpus, a fresh run: a probe of PROBE_STEPS measures the step time, then the
#            run is rescheduled (wsd) to end by TRAIN_END_S; the state at the start of the decay is packed
#            and its int8 heads go back as a bundle of their own (STABLE_HEADS=0: not)
#            (a later session resumes it with --reschedule), the decayed heads are the result;
#            TRAIN_EXTRA="--init-heads specbench/heads" trains the shipped heads on (a run whose state is gone)
#   trainbench  scripts/bench_train_step.py on that corpus: the training step by variant (TRAINBENCH_VARIANTS, default
#            none/16,bf16/16: autocast/batch), split by head, with a kernel profile; bf16 autocast for the heads it speeds
#            up becomes TRAIN_AUTOCAST for the train phases after it (TRAIN_CHOICE=0: not; TRAINBENCH_S its timeout)
#   resume   the same for the run staged in $RUN (scripts/gpu_train_session.sh stage-in), rescheduled at
#            RATE steps/s (measured by the run that made it) to end by TRAIN_END_S
#            (TRAIN_EXTRA="... --snapshot-tokens 35M": the snapshots go back after the report, a bundle each)
#   int4     $RUN/heads rounded by GPTQ as they ship (specbench head-convert --calibrate, every head at once on this
#            machine's cores, INT4_THREADS each; ~40 s for the three block heads) into $P/<kind> for each KIND[:GROUP] of
#            INT_KINDS (default int4; e.g. "int4 int3:192": int3 in groups of 192 columns; the group defaults to 64), each
#            back as a bundle;
#            TAU_HEADS_DIR=/root/pipe/int4 then replays the int4 heads (TAU_HEADS="a=DIR,b=DIR": labelled sets at once)
#   tau      tau by exact replay of $RUN/heads (TAU_HEADS_DIR: other heads, "shipped": the shipped ones; TAU_HEADS: LABEL=DIR,...;
#            scripts/tau_table.py: TAU_N items of TAU_DATASETS, default GSM8K and MATH-500, budgets 16/64/256;
#            TAU_ROWS: a table (.jsonl[.gz]) to resume) until TAU_END_S
#            TAU_DEVICE=cpu (and JPP_DEVICE=cpu below): replay on the machine's CPU cores, e.g. as "tau&" beside a
#            training phase, whose GPU work leaves them idle (the replay is fp32 exact either way); REPLAY=host (every
#            replay step): the host walk instead of the graphed device round that is CUDA's default
#   jpptau   jetspec++'s refinement grid (scripts/jetspecpp_tau.py, --parallel JPP_PARALLEL or TAU_PARALLEL: JPP_SETTINGS x chain:16,
#            JPP_HEADS: its --head flags, default the jetspec++ head JPP_HEAD beside the shipped jetspec;
#            ddtree:64, JPP_N items of the five benchmarks; JPP_ROWS: a grid to resume) until JPP_END_S
#   ablate   a fresh run of ABL_HEADS with one more head per value of ABL_GRID (from scratch, so the heads
#            compare at equal tokens) until ABL_TRAIN_END_S (its curves, log and int8 heads go back first, as
#            bundles of their own), then scripts/ablation_table.py until ABL_END_S;
#            ABL_ARGS adds train flags, e.g. labelled heads of one objective with their own losses:
#            ABL_HEADS=jetspec,sft=jetspec,rkl=jetspec ABL_GRID=" " ABL_ARGS='--head-arg sft:losses={"ce":1}
#            --head-arg rkl:losses={"rkl":1}' (Table 14; JSON, no spaces: the words are split), or
#            --head-arg noised:p_mask_only=1 (Table 13); ABL_TABLE=jpp replays every head of the run through
#            scripts/jetspecpp_tau.py instead (ABL_JPP_SETTINGS, default J0R0,J1R0,J1R1; ABL_DATASETS; ABL_N; ABL_TOKENS), e.g.
#            jetspec++ variants fill=mask, p_mask_only=1, attention=bidirectional (Tables 4 and 15)
#   kernels  the CUDA kernel tests of the fused levels, then scripts/bench_step.py (elementwise vs gemm, SmolLM2 and
#            Qwen3-8B shapes; BENCH_ARGS e.g. --profile: the AR step's and verify pass's kernel tables), then
#            scripts/bench_norm_stats.py (NS_BENCH=0: not), scripts/bench_norm_linear.py (NL_BENCH=0: not), scripts/bench_attention_plan.py (AP_BENCH=0: not; AP_ARGS e.g.
#            --plan-only: the plan and its twin of the other split merge only) and
#            scripts/bench_top_b_tree.py (TB_BENCH=0: not); BENCH_ARGS="--trace --rounds 2": graph timelines, A B A B;
#            the faster level on SmolLM2's AR
#            step becomes SPECBENCH_FUSED_LEVEL for what follows (and "stats" where it was timed and its verify
#            pass beat the gemm level's, e.g. BENCH_VARIANTS=elementwise/triton,gemm/triton,stats/triton); with
#            gemm/triton-decode timed too, SPECBENCH_ATTENTION=triton-decode where its AR step was faster on every
#            shape (FORCE_ATTENTION pins it)
#   replaybench  scripts/bench_replay.py: exact replay's host walk against the graphed device round, timed, on the
#            same references (RB_ARGS: its flags, e.g. --configs dflash/ddtree/64 --n 2; RB_S its timeout)
#   gputests python -m pytest -m "$GPUTEST_MARK" $GPUTEST_PATHS (default: -m gpu tests/gpu; SPECBENCH_JETSPECPP_HEAD=$JPP_HEAD,
#            default the shipped head); GPUTEST_PATHS="tests/kernels tests/gpu" GPUTEST_MARK="gpu or not slow" adds every
#            kernel test on CUDA; autotuned kernels compile their first config only (GPUTEST_AUTOTUNE=all: every one);
#            GPUTEST_ARGS more pytest flags (e.g. -o faulthandler_timeout=60: a stuck test's stacks)
#   topk     the ranked top-k kernel's tests on CUDA (TOPK_TESTS=0: not), then scripts/bench_ranked_topk.py (kernel vs
#            packed keys vs the stable sort)
#   treeops  the tree-op kernels' CUDA tests (select_top, beam_step, ancestor_mask, frontier_rows, node_inputs, rescore_tree, pack_bits,
#            top_b_tree; TREEOPS_TESTS=0: not), then
#            scripts/bench_tree_ops.py (each kernel against the tensor ops it replaced; TREEOPS_S its timeout)
#   profile  scripts/profile_round.py --kernels for PROFILE_CONFIGS (PROFILE_ARGS: its drafter args; PROFILE_END_S)
#   rounds   experiments/round_table.py: the per-stage round table of every drafter beside AR (ROUNDS_END_S; ROUNDS_ARGS:
#            study overrides, e.g. "drafters=[ngram] trees=[ddtree] budgets=[16,64] tree_args={}": the ngram rows only)
#   newrounds  the heads in NEW_HEADS (default the int4 phase's) installed as the shipped ones of this copy, the round
#            table with NEWROUNDS_ARGS (default: dflash, jetspec and jetspec-tree at ddtree/64, items 1-5; NEWROUNDS_END_S),
#            then the shipped heads put back
#   fstable  scripts/foresight_table.py at FS_TREES with FS_CONFIGS (JPP_HEAD, default the shipped head; FS_CAL: a
#            calibration file for the foresight scores; FS_ARGS more flags, e.g. "--J 0 --R 0" (no refinement, no refresh), with FS_TAG naming
#            their files; or FS_VARIANTS="TAG|CONFIGS|ARGS;..." several such runs per tree, e.g.
#            FS_VARIANTS="|ar,dflash,jetspec++ critical,jetspec++ pipelined|;_b8|jetspec++ pipelined|--B 8"; FS_END_S)
#   eval     the new heads installed as the shipped ones, then: foresight GPU tests, recorded rounds and
#            calibration (foresight_hits), Table 3 (foresight_table) at chain:16 and ddtree:64, the
#            per-stage round table of every drafter, each cut by its own timeout (PIPE_END_S)
# A phase written "name&" (e.g. PHASES="jpptau& corpus ablate") runs in the background beside the phases after it:
# replay processes are launch-bound and leave the GPU idle between their small kernels, which training fills.
# Each slows the other (measured: corpus generation 37k -> 17k tok/s, training about half its rate), and a training
# probe measured while a background phase is still starting up overestimates the rate: leave its deadline slack.
# Results go back as bundles (scripts/bundle.py) in the order they are made.
set -uo pipefail
ROOT=${ROOT:-/root}
export PYTHONPATH=$ROOT/site:$PWD PYTHONUNBUFFERED=1 SPECBENCH_CACHE=${SPECBENCH_CACHE:-$ROOT/cache}
export SPECBENCH_SMOLLM2_GGUF=${SPECBENCH_SMOLLM2_GGUF:-$ROOT/stage/smollm2.gguf} SPECBENCH_DATA=${SPECBENCH_DATA:-$ROOT/data}
export TRITON_CACHE_AUTOTUNING=1  # one phase's autotuning serves the next process on this machine
DEVICE=${DEVICE:-cuda}; DTYPE=${DTYPE:-bfloat16}; TARGET=${TARGET:-smollm2-135m}
P=$ROOT/pipe; SPOOL=$ROOT/spool; RUN=$ROOT/run
step=${1:?step}
bundle() { python3 scripts/bundle.py "$@"; }
now() { date +%s; }
log() { echo "[pipe $(( $(now) - $(cat $P/t0) ))s] $*"; }
left() { echo $(( $(cat $P/t0) + $1 - $(now) )); }  # seconds until second $1 of the pipeline
enough() {  # END NAME [MIN]: whether MIN (default MIN_PHASE_S, 30) seconds are left before second END; if not,
  # NAME is logged as skipped (and listed in failed.txt) rather than started with a timeout of zero or less, which
  # `timeout` refuses
  local s; s=$(left $1)
  [ $s -ge ${3:-${MIN_PHASE_S:-30}} ] && return 0
  log "SKIPPED: $2 (${s} s left before its deadline, second $1)"; echo "$2 skipped" >> $P/failed.txt; return 1
}
failed() {  # NAME RC: a step that did not finish cleanly says so in the log that `collect` shows (124: its timeout)
  log "FAILED: $1 exited with $2$([ "$2" = 124 ] && echo ' (its deadline)')"; echo "$1 $2" >> $P/failed.txt
}

# train_scheduled RUN END STEP0 RATE: train RUN until second END of the pipeline at RATE steps/s (wsd, the last
# 20% of the schedule decaying), packing the state where the decay starts; extra flags in $sched_extra
train_scheduled() {
  local run=$1 end=$2 step0=$3 rate=$4 secs total decay_at
  secs=$(left $end)
  total=$(python3 -c "print($step0 + max(50, int(0.92 * $rate * ($secs - 45))))")
  decay_at=$(python3 -c "print(max($step0 + 1, int($total - round(0.2 * $total))))")
  log "train $run: $total steps (decay from step $decay_at), $secs s left at $rate steps/s"
  python3 -m specbench.cli train $common --drafter $heads --out $run --steps $total --reschedule --until-step $decay_at $sched_extra \
    > $P/train_stable.txt 2>&1
  tail -8 $P/train_stable.txt
  if [ "${STABLE_HEADS:-1}" = 1 ] && [ -d $run/heads ]; then  # the heads where the decay starts go back first: a
    # machine taken back during the decay (or a collect that comes too late) still returns trained heads
    rm -rf $P/stable-heads && mkdir -p $P/stable-heads && cp -r $run/heads/. $P/stable-heads/
    bundle pack $(basename $run)-stable-heads stable-heads --spool $SPOOL --base $P --chunk-mib 14
  fi
  if [ "${PACK:-1}" = 1 ]; then  # PACK=0: a run no later session resumes (an ablation) is not packed
    rm -rf $ROOT/pack && python3 -m specbench.cli train-pack "$run" $ROOT/pack/run > $P/pack.txt 2>&1; cat $P/pack.txt
  fi
  python3 -m specbench.cli train $common --drafter $heads --out $run --steps $total $sched_extra > $P/train_decay.txt 2>&1
  tail -12 $P/train_decay.txt
}

merge_shards() {  # OUT MODULE: fold the shard files of MODULE's --parallel replay into OUT (tau_table.merge_shards)
  python3 -c "import sys; sys.path.insert(0, 'scripts'); import tau_table, $2; from pathlib import Path
print(len(tau_table.merge_shards(Path('$1'), $2.ROW_KEY)), 'rows in $1')" 2>&1 | sed 's/^/merge: /'
}

probe_rate() {  # steps/s over the second half of a run's logged steps (past compile and warm-up)
  python3 - "$1" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/train_log.jsonl")]
rows = [r for r in rows if r.get("kind", "train") != "val" and "step" in r and "time" in r]
a, b = rows[len(rows) // 2], rows[-1]
print(f"{(b['step'] - a['step']) / max(1e-6, b['time'] - a['time']):.3f}")
EOF
}

report_heads() {  # RUN NAME: report, plots, log and the decayed heads, as bundles
  local run=$1 name=$2
  mkdir -p $P/$name
  python3 -m specbench.cli train-report "$run" --plots $P/$name/plots > $P/$name/train_report.txt 2>&1
  cat $P/$name/train_report.txt
  gzip -c $run/train_log.jsonl > $P/$name/train_log.jsonl.gz; cp $P/*.txt $P/$name/ 2>/dev/null
  rm -rf $P/heads && mkdir -p $P/heads && cp -r $run/heads/. $P/heads/
  bundle pack $name-heads heads --spool $SPOOL --base $P --chunk-mib 14
  bundle pack $name-results $name --spool $SPOOL --base $P
  local s  # each snapshot (--snapshot-tokens in TRAIN_EXTRA: int8 heads at those token counts) as a bundle of its own
  for s in $(ls -d $run/snapshots/tok* 2>/dev/null); do
    [ -f $P/sent-$(basename $s) ] && continue
    rm -rf $ROOT/snap && mkdir -p $ROOT/snap/snapshots && cp -r $s $ROOT/snap/snapshots/
    bundle pack snapshot-$(basename $s) snapshots --spool $SPOOL --base $ROOT/snap --chunk-mib 14 && touch $P/sent-$(basename $s)
  done
}

phase_corpus() {
  # shard 0 holds the validation prompts (`specbench train --val-prompts`): always among the shards generated
  if [ -n "${GEN_SHARDS:-}" ]; then python3 -c "import sys; from specbench.train.corpus_cli import parse_shards
sys.exit(0 if 0 in parse_shards('$GEN_SHARDS') else 1)" || GEN_SHARDS="0,$GEN_SHARDS"; fi
  log "corpus for ${GEN_MINUTES:-5} min${GEN_SHARDS:+ (shards $GEN_SHARDS)}"
  GEN_MINUTES=${GEN_MINUTES:-5} bash scripts/gpu_train_session.sh corpus > $P/corpus.txt 2>&1
  tail -25 $P/corpus.txt; touch $P/corpus.done
  grep -q "^specbench: error" $P/corpus.txt && failed "corpus generate" 2  # e.g. GEN_SHARDS past shard 15 (16 shards)
}

phase_trainbench() {  # the training step by variant (scripts/bench_train_step.py); the chosen one trains next
  local T=$P/trainbench; mkdir -p $T
  log "bench_train_step: ${TRAINBENCH_VARIANTS:-none/16,bf16/16}"
  timeout ${TRAINBENCH_S:-150} python3 scripts/bench_train_step.py --corpus $ROOT/corpus --device $DEVICE --heads $HEADS \
    --variants ${TRAINBENCH_VARIANTS:-none/16,bf16/16} --max-len ${MAX_LEN:-640} --profile \
    --json $T/bench_train_step.json --choose $T/choice.txt > $T/bench_train_step.txt 2>&1 || failed "bench_train_step" $?
  grep -v "^bench_train_step:\|^USDT" $T/bench_train_step.txt | head -50
  if [ -f $T/choice.txt ] && [ "${TRAIN_CHOICE:-1}" = 1 ]; then
    read -r TRAIN_AUTOCAST BATCH < $T/choice.txt; log "training at autocast $TRAIN_AUTOCAST, batch $BATCH"; set_common
  fi
  bundle pack trainbench trainbench --spool $SPOOL --base $P
}

phase_train() {
  log "train probe: ${PROBE_STEPS:-40} steps"
  python3 -m specbench.cli train $common --drafter $HEADS --out $RUN --steps 100000 --until-step ${PROBE_STEPS:-40} > $P/train_probe.txt 2>&1 \
    || { tail -5 $P/train_probe.txt; failed "train probe" $?; return; }  # e.g. no finished corpus shard
  tail -5 $P/train_probe.txt
  local rate; rate=$(probe_rate $RUN) || { failed "train probe rate" $?; return; }
  heads=$HEADS sched_extra="" train_scheduled $RUN ${TRAIN_END_S:-930} ${PROBE_STEPS:-40} $rate
  report_heads $RUN train
  log "train done"; touch $P/train.done
}

phase_resume() {
  local step0
  step0=$(python3 -c "import json; print(json.load(open('$RUN/run.json'))['step'])")
  log "resume $RUN at step $step0"
  heads=$HEADS sched_extra="${RESUME_EXTRA:-}" train_scheduled $RUN ${TRAIN_END_S:-480} $step0 ${RATE:-3.1}
  report_heads $RUN resume
  log "resume done"; touch $P/train.done
}

phase_int4() {  # each head's GPTQ errors in $P/<kind>/<head>.txt, beside it (tau_table reads only DIR/<drafter>/)
  local spec kind group I h
  for spec in ${INT_KINDS:-int4}; do
    kind=${spec%%:*}; group=64; [ "$spec" != "$kind" ] && group=${spec#*:}
    I=$P/$kind; rm -rf $I; mkdir -p $I
    log "$kind: GPTQ of $(ls $RUN/heads | tr '\n' ' ')(groups of $group columns)"
    for h in $(ls $RUN/heads); do
      timeout ${INT4_S:-900} python3 -m specbench.cli head-convert $RUN/heads/$h $I/$h --storage $kind --group $group \
        --calibrate $SPECBENCH_DATA --threads ${INT4_THREADS:-5} > $I/$h.txt 2>&1 || failed "head-convert $h $kind" $? &
    done
    wait
    tail -n 2 $I/*.txt
    bundle pack $kind-heads $kind --spool $SPOOL --base $P --chunk-mib 14
  done
}

phase_tau() {
  local T=$P/tau heads="--heads-dir ${TAU_HEADS_DIR:-$RUN/heads}"; mkdir -p $T
  enough ${TAU_END_S:-600} tau_table || return
  [ "${TAU_HEADS_DIR:-}" = shipped ] && heads=""
  [ -n "${TAU_HEADS:-}" ] && heads="--heads $TAU_HEADS"  # labelled head sets, e.g. int4 beside int3 of one run
  [ -n "${TAU_ROWS:-}" ] && zcat -f "$TAU_ROWS" > $T/tau.jsonl  # resume a table kept in the repository
  log "tau by replay: ${TAU_DATASETS:-gsm8k,math500}, ${heads:-the shipped heads}"
  timeout $(left ${TAU_END_S:-600}) python3 scripts/tau_table.py --device ${TAU_DEVICE:-$DEVICE} --replay ${REPLAY:-auto} --data $SPECBENCH_DATA $heads \
    --datasets ${TAU_DATASETS:-gsm8k,math500} --n ${TAU_N:-20} --budgets 16,64,256 --parallel ${TAU_PARALLEL:-14} --ref-batch 4 --threads 1 \
    --minutes $(python3 -c "print(max(0.5, ($(left ${TAU_END_S:-600}) - 30) / 60))") --out $T/tau.jsonl > $T/tau.txt 2>&1 || failed "tau_table" $?
  merge_shards $T/tau.jsonl tau_table && rm -f $T/tau.shard*.jsonl  # a timeout may cut the merge of the shards
  python3 scripts/tau_table.py --out $T/tau.jsonl --table-only > $T/table.txt 2>&1; cat $T/table.txt
  gzip -f $T/tau.jsonl
  bundle pack tau tau --spool $SPOOL --base $P
}

phase_jpptau() {
  local J=$P/jpptau; mkdir -p $J
  enough ${JPP_END_S:-600} jetspecpp_tau || return
  [ -n "${JPP_ROWS:-}" ] && zcat -f "$JPP_ROWS" > $J/rows.jsonl  # resume a grid kept in the repository
  log "jetspec++ refinement grid by replay: ${JPP_SETTINGS:-J0R0,J1R0,J2R0,J3R0,J1R1,J1R1n,J1R1:true,J1R1:stale}, n ${JPP_N:-50}"
  timeout $(left ${JPP_END_S:-600}) python3 scripts/jetspecpp_tau.py --device ${JPP_DEVICE:-$DEVICE} --replay ${REPLAY:-auto} --data $SPECBENCH_DATA \
    ${JPP_HEADS:---head jetspec++=${JPP_HEAD:-specbench/heads/jetspec++-smollm2-135m} --head jetspec=specbench/heads/jetspec-smollm2-135m} \
    --settings ${JPP_SETTINGS:-J0R0,J1R0,J2R0,J3R0,J1R1,J1R1n,J1R1:true,J1R1:stale} --trees ${JPP_TREES:-chain:16,ddtree:64} \
    --datasets ${JPP_DATASETS:-gsm8k,math500,mbpp,humaneval,mt_bench} --n ${JPP_N:-50} --max-new-tokens ${JPP_TOKENS:-128} \
    --parallel ${JPP_PARALLEL:-${TAU_PARALLEL:-14}} --threads 1 \
    --minutes $(python3 -c "print(max(0.5, ($(left ${JPP_END_S:-600}) - 60) / 60))") --out $J/rows.jsonl > $J/jpptau.txt 2>&1 || failed "jetspecpp_tau" $?
  grep -v "^jetspecpp_tau: [0-9]" $J/jpptau.txt | tail -40
  merge_shards $J/rows.jsonl jetspecpp_tau && rm -f $J/rows.shard*.jsonl
  python3 scripts/jetspecpp_tau.py --out $J/rows.jsonl --head x=y --table-only | tail -40
  gzip -f $J/rows.jsonl
  bundle pack jpptau jpptau --spool $SPOOL --base $P
}

phase_ablate() {
  local RA=$ROOT/run-ablation A=$P/ablation grid="" g; mkdir -p $A
  for g in ${ABL_GRID:-num_layers=2,3 num_taps=1,5 block_size=8}; do grid="$grid --grid $g"; done
  log "ablation run: ${ABL_HEADS:-dflash} $grid"
  python3 -m specbench.cli train $common --drafter ${ABL_HEADS:-dflash} $grid ${ABL_ARGS:-} --out $RA --steps 100000 \
    --until-step ${PROBE_STEPS:-40} > $A/probe.txt 2>&1
  tail -4 $A/probe.txt
  heads="${ABL_HEADS:-dflash} $grid" sched_extra="${ABL_ARGS:-}" train_scheduled $RA ${ABL_TRAIN_END_S:-780} ${PROBE_STEPS:-40} $(probe_rate $RA)
  python3 -m specbench.cli train-report "$RA" --plots $A/plots > $A/train_report.txt 2>&1; cat $A/train_report.txt
  # the training's report, curves and log go back before the replay starts: a machine lost during the
  # replay (as on 2026-12-06) still returns them
  mkdir -p $P/ablation-train && cp -r $A/plots $A/train_report.txt $P/ablation-train/ 2>/dev/null
  gzip -c $RA/train_log.jsonl > $P/ablation-train/train_log.jsonl.gz
  bundle pack ablation-train ablation-train --spool $SPOOL --base $P
  # and the heads (int8, ~53 MB for five): a lost replay is then redone on any CPU (scripts/jetspecpp_tau.py)
  bundle pack ablation-heads heads --spool $SPOOL --base $RA --chunk-mib 14
  touch $P/ablate-train.done  # `collect SECONDS ablate-train` returns with them
  if ! enough ${ABL_END_S:-900} "ablation table"; then
    :  # the heads, curves and log went back above: the replay is for another machine
  elif [ "${ABL_TABLE:-ablation}" = jpp ]; then  # every head of the run through jetspec++'s grid (Tables 4, 13-15)
    local hs="" h
    for h in $(ls $RA/heads); do hs="$hs --head $h=$RA/heads/$h"; done
    log "ablation grid (jetspecpp_tau):$hs"
    timeout $(left ${ABL_END_S:-900}) python3 scripts/jetspecpp_tau.py --device $DEVICE --replay ${REPLAY:-auto} --data $SPECBENCH_DATA $hs \
      --settings ${ABL_JPP_SETTINGS:-J0R0,J1R0,J1R1} --trees ${JPP_TREES:-chain:16,ddtree:64} \
      --datasets ${ABL_DATASETS:-gsm8k,math500,mbpp,humaneval,mt_bench} --n ${ABL_N:-20} --max-new-tokens ${ABL_TOKENS:-${JPP_TOKENS:-128}} \
      --parallel ${ABL_PARALLEL:-${TAU_PARALLEL:-14}} --threads 1 --out $A/grid.jsonl \
      --minutes $(python3 -c "print(max(0.5, ($(left ${ABL_END_S:-900}) - 60) / 60))") > $A/grid.txt 2>&1 || failed "ablation grid" $?
    grep -v "^jetspecpp_tau: [0-9]" $A/grid.txt | tail -60
    merge_shards $A/grid.jsonl jetspecpp_tau && rm -f $A/grid.shard*.jsonl
    gzip -f $A/grid.jsonl
  else
    log "ablation table"
    timeout $(left ${ABL_END_S:-900}) python3 scripts/ablation_table.py --run $RA --data $SPECBENCH_DATA --out $A/table \
      --n ${ABL_N:-20} --budgets ${ABL_BUDGETS:-16,64} --device $DEVICE --parallel ${TAU_PARALLEL:-14} --ref-batch 4 \
      --minutes $(python3 -c "print(max(0.5, ($(left ${ABL_END_S:-900}) - 90) / 60))") > $A/ablation.txt 2>&1 || failed "ablation_table" $?
    tail -40 $A/ablation.txt
  fi
  gzip -c $RA/train_log.jsonl > $A/train_log.jsonl.gz
  bundle pack ablation ablation --spool $SPOOL --base $P
}

phase_kernels() {
  local K=$P/kernels; mkdir -p $K
  if [ "${KERNEL_TESTS:-1}" = 1 ]; then
    log "kernel tests (CUDA)"
    SPECBENCH_AUTOTUNE=first timeout ${KTEST_S:-120} python3 -m pytest tests/kernels/test_norm_linear.py \
      tests/kernels/test_fused_decoder.py tests/kernels/test_attention_plan_script.py tests/kernels/test_tree_attention.py \
      -p no:cacheprovider > $K/tests.txt 2>&1
    tail -4 $K/tests.txt
  fi
  log "bench_step"
  timeout ${BENCH_S:-180} python3 scripts/bench_step.py --shapes ${BENCH_SHAPES:-smollm2-135m-shape,qwen3-8b-shape} \
    --variants ${BENCH_VARIANTS:-elementwise/triton,gemm/triton} ${BENCH_ARGS:-} --out $K/bench_step.json > $K/bench_step.txt 2>&1 || failed "bench_step" $?
  grep -v "^ *$" $K/bench_step.txt | tail -30
  if [ "${NS_BENCH:-1}" = 1 ]; then
    log "bench_norm_stats (a layer's chain without its RMSNorm kernels: the norms' statistics from the products)"
    timeout ${NS_BENCH_S:-150} python3 scripts/bench_norm_stats.py --out $K/norm_stats.json > $K/norm_stats.txt 2>&1 || failed "bench_norm_stats" $?
    tail -6 $K/norm_stats.txt
  fi
  if [ "${NL_BENCH:-1}" = 1 ]; then
    log "bench_norm_linear (the row kernels' configs at 17/65 rows vs the unfused compositions)"
    timeout ${NL_BENCH_S:-180} python3 scripts/bench_norm_linear.py --out $K/bench_norm_linear.json > $K/bench_norm_linear.txt 2>&1
    grep -v differs $K/bench_norm_linear.txt | tail -24
  fi
  if [ "${AP_BENCH:-1}" = 1 ]; then
    log "bench_attention_plan (tree attention's configs over the engine's whole cache vs the plan)"
    timeout ${AP_BENCH_S:-150} python3 scripts/bench_attention_plan.py ${AP_ARGS:-} --out $K/attention_plan.json > $K/attention_plan.txt 2>&1
    tail -32 $K/attention_plan.txt
  fi
  if [ "${TB_BENCH:-1}" = 1 ]; then
    log "bench_top_b_tree (the top-B tree kernel's warp counts)"
    timeout ${TB_BENCH_S:-90} python3 scripts/bench_top_b_tree.py --out $K/top_b_tree.json > $K/top_b_tree.txt 2>&1
    tail -24 $K/top_b_tree.txt
  fi
  local level
  level=$(python3 - $K/bench_step.json <<'EOF'
import json, sys
try:
    rows = [r for r in json.load(open(sys.argv[1]))["rows"] if "error" not in r and r["shape"].startswith("smollm2")]
except (OSError, ValueError, KeyError):
    rows = []
def median(v):
    return sorted(v)[len(v) // 2]
ar, ver = {}, {}  # the median over --rounds of each level's AR step and verify pass, replays issued back to back
for r in rows:  # (the synchronized step's host-launch gap varies by run: bench_step.py's docstring)
    if r["attention"] == "triton":
        ar.setdefault(r["ops"], []).append(r.get("ar_b2b_ms", r["ar_ms"]))
        ver.setdefault(r["ops"], []).append(r.get("verify65_b2b_ms", r["verify65_ms"]))
ar, ver = {k: median(v) for k, v in ar.items()}, {k: median(v) for k, v in ver.items()}
choice = None  # only a comparison decides; else the code's default level stays
if "gemm" in ar and "elementwise" in ar:
    choice = "gemm" if ar["gemm"] < ar["elementwise"] else "elementwise"
if "stats" in ver and "gemm" in ver and choice in (None, "gemm") and ver["stats"] < ver["gemm"]:
    choice = "stats"  # the gemm level's AR step (one row), without the RMSNorm kernels at verify's rows
print(choice or "")
EOF
)
  local attention  # the decode kernel where every shape's AR step (median over --rounds, back to back) ran faster on it
  attention=$(python3 - $K/bench_step.json <<'EOF'
import json, sys
try:
    rows = [r for r in json.load(open(sys.argv[1]))["rows"] if "error" not in r and r["ops"] == "gemm"]
except (OSError, ValueError, KeyError):
    rows = []
ar = {}
for r in rows:
    ar.setdefault((r["shape"], r["attention"]), []).append(r.get("ar_b2b_ms", r["ar_ms"]))
def median(v):
    return sorted(v)[len(v) // 2]
faster = [median(ar[(s, "triton-decode")]) < median(ar[(s, "triton")])
          for s, a in ar if a == "triton-decode" and (s, "triton") in ar]
print("triton-decode" if faster and all(faster) else "")
EOF
)
  attention=${FORCE_ATTENTION:-$attention}
  if [ -n "$attention" ]; then export SPECBENCH_ATTENTION=$attention; log "attention for what follows: $attention"; fi
  echo ${SPECBENCH_ATTENTION:-default} > $K/attention.txt
  level=${FORCE_LEVEL:-$level}
  if [ -n "$level" ]; then export SPECBENCH_FUSED_LEVEL=$level; log "fused level for what follows: $level"
  else log "fused level for what follows: the default (no two levels timed against each other)"; fi
  echo ${SPECBENCH_FUSED_LEVEL:-default} > $K/level.txt
  bundle pack kernels kernels --spool $SPOOL --base $P
}

phase_replaybench() {
  local R=$P/replaybench; mkdir -p $R
  log "exact replay: the host walk vs the graphed device round"
  timeout ${RB_S:-300} python3 scripts/bench_replay.py --device $DEVICE --data $SPECBENCH_DATA ${RB_ARGS:-} \
    --out $R/replaybench.json > $R/replaybench.txt 2>&1 || failed "bench_replay" $?
  tail -12 $R/replaybench.txt
  bundle pack replaybench replaybench --spool $SPOOL --base $P
}

phase_gputests() {
  local G=$P/gputests; mkdir -p $G
  enough ${GPUTEST_END_S:-400} "GPU tests" || return
  log "GPU tests"
  SPECBENCH_AUTOTUNE=${GPUTEST_AUTOTUNE:-first} SPECBENCH_JETSPECPP_HEAD=${JPP_HEAD:-specbench/heads/jetspec++-smollm2-135m} timeout $(left ${GPUTEST_END_S:-400}) python3 -m pytest -m "${GPUTEST_MARK:-gpu}" ${GPUTEST_PATHS:-tests/gpu} ${GPUTEST_ARGS:-} -vv \
    -p no:cacheprovider -rs > $G/tests.txt 2>&1; grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" $G/tests.txt | tail -40
  bundle pack gputests gputests --spool $SPOOL --base $P
}

phase_topk() {
  local T=$P/topk; mkdir -p $T
  log "ranked top-k: CUDA tests, then the benchmark"
  if [ "${TOPK_TESTS:-1}" = 1 ]; then
    timeout ${TOPK_TEST_S:-120} python3 -m pytest -m "gpu or not slow" tests/kernels/test_ranked_topk.py -p no:cacheprovider \
      > $T/tests.txt 2>&1; tail -4 $T/tests.txt
  fi
  timeout ${TOPK_BENCH_S:-120} python3 scripts/bench_ranked_topk.py --out $T/bench.json > $T/bench.txt 2>&1; cat $T/bench.txt
  bundle pack topk topk --spool $SPOOL --base $P
}

phase_treeops() {
  local T=$P/treeops; mkdir -p $T
  log "tree ops: CUDA tests, then the benchmark"
  if [ "${TREEOPS_TESTS:-1}" = 1 ]; then
    SPECBENCH_AUTOTUNE=first timeout ${TREEOPS_TEST_S:-150} python3 -m pytest -m "gpu or not slow" -p no:cacheprovider \
      tests/kernels/test_select_top.py tests/kernels/test_beam_step.py tests/kernels/test_ancestor_mask.py tests/kernels/test_frontier_rows.py \
      tests/kernels/test_node_inputs.py tests/kernels/test_rescore_tree.py tests/kernels/test_pack_bits.py tests/kernels/test_top_b_tree.py \
      > $T/tests.txt 2>&1
    tail -4 $T/tests.txt
  fi
  timeout ${TREEOPS_S:-120} python3 scripts/bench_tree_ops.py --json $T/bench_tree_ops.json > $T/bench.txt 2>&1 \
    || failed "bench_tree_ops" $?
  cat $T/bench.txt
  bundle pack treeops treeops --spool $SPOOL --base $P
}

phase_profile() {
  local R=$P/profile pargs=${PROFILE_ARGS:-}; mkdir -p $R
  [ -n "$pargs" ] || pargs='{"foresight": "on", "B": 16, "J": 1, "R": 1}'
  enough ${PROFILE_END_S:-900} "kernel profile" || return
  log "kernel profile: ${PROFILE_CONFIGS:-jetspec++/chain/16} $pargs"
  timeout $(left ${PROFILE_END_S:-900}) python3 scripts/profile_round.py --device $DEVICE --dtype $DTYPE --prompts 1 \
    --max-new-tokens 128 --top 40 --kernels --configs "${PROFILE_CONFIGS:-jetspec++/chain/16}" \
    --drafter-args "$pargs" > $R/profile.txt 2>&1
  grep -E "^== |Self CUDA time total" $R/profile.txt
  bundle pack profile profile --spool $SPOOL --base $P
}

phase_rounds() {
  local R=$P/rounds; mkdir -p $R
  enough ${ROUNDS_END_S:-600} "round table" || return
  log "round table"
  timeout $(left ${ROUNDS_END_S:-600}) python3 -m specbench.cli run experiments/round_table.py --device $DEVICE --dtype $DTYPE \
    --data-dir $SPECBENCH_DATA --out $R/round_table ${ROUNDS_ARGS:-} > $R/round_table.txt 2>&1 || failed "round table" $?
  tail -30 $R/round_table.txt
  python3 -m specbench.cli table $R/round_table/results.jsonl --rows drafter,drafter_args,tree,budget,tree_args --cols dataset \
    --value tau,decode_tok_s,speedup_decode,draft_ms,tree_ms,verify_forward_ms,verify_ms,commit_ms,round_ms,overhead_frac \
    > $R/stages.txt 2>&1; cat $R/stages.txt | head -60
  bundle pack rounds rounds --spool $SPOOL --base $P
}

phase_newrounds() {  # e.g. grown heads' speed before they ship: specbench/heads/<drafter>-$TARGET replaced for the
  # round table, the shipped ones put back after it (the phases after this one, and a checkout, keep them)
  local R=$P/newrounds src=${NEW_HEADS:-$P/int4} h; mkdir -p $R/shipped
  enough ${NEWROUNDS_END_S:-600} "new heads' round table" || return
  for h in $(ls $src); do
    [ -f $src/$h/config.json ] || continue
    [ -d specbench/heads/$h-$TARGET ] && cp -r specbench/heads/$h-$TARGET $R/shipped/
    rm -rf specbench/heads/$h-$TARGET && cp -r $src/$h specbench/heads/$h-$TARGET && echo "installed $h" >> $R/installed.txt
  done
  log "round table on $(cat $R/installed.txt 2>/dev/null | tr '\n' ' ')from $src"
  timeout $(left ${NEWROUNDS_END_S:-600}) python3 -m specbench.cli run experiments/round_table.py --device $DEVICE --dtype $DTYPE \
    --data-dir $SPECBENCH_DATA --out $R/round_table ${NEWROUNDS_ARGS:-"drafters=[dflash,jetspec,jetspec-tree]" "trees=[ddtree]" \
    "budgets=[64]" "tree_args={}" "drafter_args={}" n=5} > $R/round_table.txt 2>&1 || failed "new heads' round table" $?
  tail -12 $R/round_table.txt
  python3 -m specbench.cli table $R/round_table/results.jsonl --rows drafter,drafter_args,tree,budget,tree_args --cols dataset \
    --value tau,decode_tok_s,speedup_decode,draft_ms,tree_ms,verify_forward_ms,verify_ms,commit_ms,round_ms,overhead_frac \
    > $R/stages.txt 2>&1; head -40 $R/stages.txt
  for h in $(ls $R/shipped); do rm -rf specbench/heads/$h && cp -r $R/shipped/$h specbench/heads/$h; done
  rm -rf $R/shipped
  bundle pack newrounds newrounds --spool $SPOOL --base $P
}

phase_fstable() {
  local F=$P/fstable tree v tag cfgs args vlist
  mkdir -p $F
  IFS=';' read -ra vlist <<< "${FS_VARIANTS:-${FS_TAG:-}|${FS_CONFIGS:-ar,dflash,jetspec,jetspec++ critical,jetspec++ pipelined}|${FS_ARGS:-}}"
  for tree in ${FS_TREES:-chain:16}; do
    for v in "${vlist[@]}"; do
      IFS='|' read -r tag cfgs args <<< "$v"
      enough ${FS_END_S:-700} "the $tree$tag foresight table" 45 || continue
      log "foresight_table $tree$tag: $cfgs $args"
      timeout $(left ${FS_END_S:-700}) python3 scripts/foresight_table.py --data $SPECBENCH_DATA --device $DEVICE --dtype $DTYPE \
        --target $TARGET --head ${JPP_HEAD:-specbench/heads/jetspec++-smollm2-135m} ${FS_CAL:+--calibration $FS_CAL} --tree $tree \
        --n ${FS_N:-5} --max-new-tokens 256 --configs "$cfgs" $args \
        --out $F/table_${tree%%:*}$tag.jsonl > $F/table_${tree%%:*}$tag.txt 2>&1
      grep -v "^foresight_table:" $F/table_${tree%%:*}$tag.txt | tail -20
    done
  done
  bundle pack fstable fstable --spool $SPOOL --base $P
}

phase_eval() {  # the new heads are the shipped ones for this copy
  for h in dflash jetspec jetspec-tree eagle3; do
    [ -d $RUN/heads/$h ] && rm -rf specbench/heads/$h-smollm2-135m && mkdir -p specbench/heads/$h-smollm2-135m && \
      cp -r $RUN/heads/$h/. specbench/heads/$h-smollm2-135m/
  done
  JPP=$RUN/heads/jetspec++; E=$P/eval; mkdir -p $E
  log "foresight GPU tests"
  timeout 150 python3 -m pytest -m gpu tests/gpu/test_foresight_cuda.py -p no:cacheprovider > $E/gpu_tests.txt 2>&1
  tail -5 $E/gpu_tests.txt
  log "foresight_hits: recorded rounds + calibration"
  timeout ${HITS_TIMEOUT:-130} python3 scripts/foresight_hits.py --data $SPECBENCH_DATA --head $JPP --device $DEVICE --dtype float32 \
    --target $TARGET --tree chain:16 --datasets gsm8k,math500 --n ${HITS_N:-6} --max-new-tokens 128 --minutes ${HITS_MINUTES:-1.3} \
    --out $E/hits > $E/hits.txt 2>&1
  tail -40 $E/hits.txt
  cal=""; [ -f $E/hits/calibration.json ] && cal="--calibration $E/hits/calibration.json"
  for tree in chain:16 ddtree:64; do
    enough ${PIPE_END_S:-1320} "the $tree foresight table" 60 || continue
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
}

set_common() {  # the training flags every train call shares (BATCH and TRAIN_AUTOCAST: trainbench may set them)
  common="--device $DEVICE --corpus $ROOT/corpus --schedule wsd --batch-size ${BATCH:-16} --max-len ${MAX_LEN:-640} \
    --val-every ${VAL_EVERY:-250} --val-tau-every 0 --save-every 100000 --autocast ${TRAIN_AUTOCAST:-none} --quiet ${TRAIN_EXTRA:-}"
}

run_pipeline() {
  HEADS=${TRAIN_HEADS:-dflash,jetspec,jetspec-tree,eagle3,jetspec++}
  set_common
  local phase
  for phase in ${PHASES:-corpus train eval}; do  # "name&": that phase runs beside the ones after it
    declare -F phase_${phase%&} > /dev/null || { log "unknown phase $phase"; continue; }
    if [ "${phase%&}" != "$phase" ]; then phase_${phase%&} & else phase_$phase; fi
  done
  wait  # the phases run beside the others
  [ -d $ROOT/pack/run ] && bundle pack run run --spool $SPOOL --base $ROOT/pack --chunk-mib 14
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
  collect)  # collect SECONDS [MARKER: corpus | train | ablate-train | all]
    end=$(( $(now) + ${2:-540} )); mark=$P/${3:-all}.done; [ "${3:-all}" = all ] && mark=$P/done
    while [ $(now) -lt $end ] && [ ! -f $mark ] && [ ! -f $P/done ]; do sleep 3; done
    [ -d $ROOT/out-corpus ] && for f in $ROOT/out-corpus/*; do [ -f "$f" ] && mv "$f" "$OUT/"; done
    bundle send --spool $SPOOL --to "$OUT" --max-files 8 --max-mib 62
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
    tail -${LINES_BACK:-70} $P/log; [ -f $P/failed.txt ] && { echo "failed steps:"; cat $P/failed.txt; }; ls -la "$OUT" ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
