#!/usr/bin/env bash
# The GPU jobs of one H200 session, one step per device call (each < 10 minutes):
#   scripts/gpu_session.sh stage-a | stage-b      copy a model part to /root/stage (carry .gpu-a / .gpu-b)
#   scripts/gpu_session.sh stage-c                last part + checksum + gguf wheel + data + dequantize (carry .gpu-c .gpu-data)
#   scripts/gpu_session.sh train                  train dflash, jetspec, jetspec-tree, eagle3 heads together
#   scripts/gpu_session.sh kernels                Triton kernels: correctness, benchmark, accept/compact, gpu tests
#   scripts/gpu_session.sh eval1                  tau table (exact replay) + decode tok/s sweep with the trained heads
#   scripts/gpu_session.sh eval2                  AR vs transformers, tree builders, draft cost, GPU spine tests
#   scripts/gpu_session.sh profile                GPU verifier tests + where a round's time goes (profile_round.py)
#   scripts/gpu_session.sh tau                    tau table by exact replay (resumes from .gpu-results/tau.jsonl)
#   scripts/gpu_session.sh attn                   the same head_table subset with attention=sdpa, then =triton
#   scripts/gpu_session.sh sweep                  decode tok/s of the head table (experiments/head_table.py)
#   scripts/gpu_session.sh round1                 GPU tests of the graphed round + decode step vs bandwidth bound
#   scripts/gpu_session.sh round2                 per-stage round table of every drafter + AR vs transformers
#   scripts/gpu_session.sh foresight              jetspec++ foresight GPU tests + Table 3 (FS_HEAD, FS_STATES, FS_CAL, FS_N)
# Heads come from specbench/heads/ (the shipped int8 heads) unless `train` ran in this session.
# Model parts come from ../shared/gpu/stage-model.sh; the heads trained by `train` stay in /root/heads
# for the later steps. Each eval step writes under /root/results/<step>/ and returns one tarball in $OUT
# (the device returns at most 8 files).
set -uo pipefail
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 SPECBENCH_CACHE=/root/cache
export SPECBENCH_SMOLLM2_GGUF=/root/stage/smollm2.gguf SPECBENCH_DATA=/root/data
step=${1:?step}
t0=$(date +%s)
since() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

install_heads() {  # trained heads where the drafters look for them (and a flat dir for --heads-dir)
  for h in dflash jetspec jetspec-tree eagle3; do
    [ -d /root/heads/$h/int8 ] || { echo "no trained $h head"; continue; }
    mkdir -p specbench/heads/$h-smollm2-135m /root/hi/$h
    cp -r /root/heads/$h/int8/. specbench/heads/$h-smollm2-135m/
    cp -r /root/heads/$h/int8/. /root/hi/$h/
  done
}

case "$step" in
  stage-a|stage-b)
    part=${step#stage-}
    mkdir -p /root/stage && cp .gpu-$part/smollm2.part-$part /root/stage/
    [ -d .gpu-train ] && mkdir -p /root/data && cp -r .gpu-train/. /root/data/  # training prompts (corpus), carried beside a part
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
    ls -la /root/stage ;;
  stage-c)
    cp .gpu-c/smollm2.part-c /root/stage/
    cat /root/stage/smollm2.part-a /root/stage/smollm2.part-b /root/stage/smollm2.part-c > /root/stage/smollm2.gguf
    echo "$(cat .gpu-c/smollm2.sha256)  /root/stage/smollm2.gguf" | sha256sum -c || exit 1
    python3 -m pip install -q --no-index --no-deps --target /root/site .gpu-c/gguf-*.whl
    mkdir -p /root/data && cp -r .gpu-data/. /root/data/
    python3 -c "
from specbench.models import load_target
t = load_target('smollm2-135m', device='cuda', dtype='bfloat16')
print('fingerprint', t.fingerprint, 'cache', t.meta['source'])" ;;
  train)
    python3 scripts/train_heads_gpu.py --target smollm2-135m --data /root/data \
      --heads dflash,jetspec,jetspec-tree,eagle3 --minutes "${TRAIN_MINUTES:-8.6}" --out "$OUT" 2>&1 | tee "$OUT/train_stdout.log"
    mkdir -p /root/heads && for f in "$OUT"/*.tar; do tar -xf "$f" -C /root/heads; done
    ls /root/heads/* ;;
  kernels)
    python3 scripts/gpu_kernels.py --budget "${KERNEL_BUDGET:-270}" ;;
  eval1)
    R=/root/results/eval1; mkdir -p $R
    install_heads
    since "tau table (exact replay, fp32)"
    timeout 200 python3 scripts/tau_table.py --target smollm2-135m --device cuda --data /root/data \
      --heads-dir /root/hi --out "$R/tau.jsonl" --parallel 8 --ref-batch 4 --minutes 2.6 --max-new-tokens 256
    python3 scripts/tau_table.py --out "$R/tau.jsonl" --table-only > "$R/tau_table.md"; tail -40 "$R/tau_table.md"
    since "decode tok/s sweep (real engine, bf16, CUDA graphs)"
    timeout 170 specbench run --device cuda --dtype bfloat16 --out "$R/sweep" --no-progress \
      experiments/budget_sweep.py n=2 budgets=[16,64,256]
    specbench table "$R/sweep/results.jsonl" --rows drafter,tree,budget --cols dataset \
      --value tau,decode_tok_s,speedup_decode | tee "$R/sweep_table.md"
    tar -czf "$OUT/eval1.tgz" -C /root/results eval1
    since done ;;
  eval2)
    R=/root/results/eval2; mkdir -p $R
    install_heads
    since "GPU spine tests"
    timeout 90 python3 -m pytest -m gpu tests/gpu -p no:cacheprovider 2>&1 | tail -5
    since "AR: native vs transformers generate (bf16)"
    timeout 150 python3 scripts/bench_spine.py --device cuda --dtype bfloat16 --gsm8k 10 --budgets 8,16 \
      --json-out "$R/bench_spine.json" 2>&1 | grep -v Warning
    since "tree builders on the GPU"
    timeout 100 python3 scripts/bench_trees.py --device cuda --target smollm2-135m --out "$R/trees" 2>&1 | tail -25
    since "draft cost per round: eagle3 vs jetspec"
    timeout 150 specbench run experiments/draft_cost.py --device cuda --dtype bfloat16 --data-dir /root/data \
      --out "$R/cost" --no-progress n=1 max_new_tokens=[64] 2>&1 | tail -46
    tar -czf "$OUT/eval2.tgz" -C /root/results eval2
    since done ;;
  profile)
    R=/root/results/profile; mkdir -p $R
    since "GPU verifier tests"
    timeout 120 python3 -m pytest -m gpu tests/verify -p no:cacheprovider > $R/verify_gpu.txt 2>&1; tail -3 $R/verify_gpu.txt
    configs="${PROFILE_CONFIGS:-ar/chain/1,dflash/chain/16,dflash/ddtree/64,jetspec-tree/ddtree/64,eagle3/eagle2/64,self/chain/4}"
    for variant in masked-sdpa-off-cudnn cudnn-allowed; do
      since "round profile ($variant; bf16, CUDA graphs)"
      SPECBENCH_SDPA_CUDNN=$([ $variant = cudnn-allowed ] && echo 1 || echo 0) timeout 200 python3 scripts/profile_round.py \
        --device cuda --dtype bfloat16 --prompts 1 --max-new-tokens 96 --top 15 --configs "$configs" \
        $([ $variant = masked-sdpa-off-cudnn ] && echo --kernels) > $R/$variant.txt 2>&1
      grep "^==" $R/$variant.txt
    done
    tar -czf "$OUT/profile.tgz" -C /root/results profile
    since done ;;
  tau)
    R=/root/results/tau; mkdir -p $R
    [ -f .gpu-results/tau.jsonl ] && cp .gpu-results/tau.jsonl $R/tau.jsonl
    since "tau table (exact replay, fp32), $(wc -l < $R/tau.jsonl 2>/dev/null || echo 0) rows so far"
    timeout $(( ${TAU_SECONDS:-540} + 40 )) python3 scripts/tau_table.py --target smollm2-135m --device cuda --data /root/data \
      --out "$R/tau.jsonl" --parallel "${TAU_PARALLEL:-12}" --ref-batch 4 --minutes "$(python3 -c "print(${TAU_SECONDS:-540}/60 - 1.5)")" \
      --max-new-tokens 256 2>&1 | grep -v "tau_table: [0-9]" | tail -40
    cat $R/tau.jsonl $R/tau.shard*.jsonl | gzip > "$OUT/tau_rows.jsonl.gz"  # the shards too, in case the merge was cut off; gzip: a full table is over the per-file return limit
    since done ;;
  attn)
    R=/root/results/attn; mkdir -p $R
    for a in sdpa triton; do
      since "decode tok/s with attention=$a (head_table subset)"
      timeout "${ATTN_SECONDS:-120}" python3 -m specbench.cli run --device cuda --dtype bfloat16 --data-dir /root/data \
        --out "$R/$a" --no-progress experiments/head_table.py n="${ATTN_N:-2}" 'max_new_tokens=[128]' attention=$a \
        'drafters=[dflash,jetspec-tree,ngram]' 'trees=[ddtree]' 'budgets=[64]' | tail -3
    done
    tar -czf "$OUT/attn.tgz" -C /root/results attn
    since done ;;
  sweep)
    R=/root/results/sweep; mkdir -p $R
    since "decode tok/s: experiments/head_table.py (bf16, CUDA graphs)"
    timeout "${SWEEP_SECONDS:-400}" python3 -m specbench.cli run --device cuda --dtype bfloat16 --data-dir /root/data \
      --out "$R/run" --no-progress experiments/head_table.py n="${SWEEP_N:-2}" ${SWEEP_ARGS:-}
    python3 -m specbench.cli table "$R/run/results.jsonl" --rows drafter,tree,budget --cols dataset \
      --value tau,decode_tok_s,speedup_decode | tee "$R/table.md"
    tar -czf "$OUT/sweep.tgz" -C /root/results sweep
    since done ;;
  round1)  # issue 13: the graphed round's GPU tests, then the decode step against its bandwidth bound
    R=/root/results/round1; mkdir -p $R
    since "GPU tests: graphed round == eager == AR (fp32), kernels at full size"
    timeout "${TEST_SECONDS:-330}" python3 -m pytest -m "not slow" tests/gpu tests/kernels -p no:cacheprovider \
      > $R/gpu_tests.txt 2>&1; tail -30 $R/gpu_tests.txt
    since "decode step and verify(65) vs the bandwidth bound (random weights, bf16)"
    timeout "${STEP_SECONDS:-200}" python3 scripts/bench_step.py --profile --out $R/bench_step.json > $R/bench_step.txt 2>&1
    grep -v "^-" $R/bench_step.txt | tail -70
    tar -czf "$OUT/round1.tgz" -C /root/results round1
    since done ;;
  round2)  # issue 13: the per-stage round table of every drafter, then AR against transformers generate
    R=/root/results/round2; mkdir -p $R
    since "round table: experiments/round_table.py (bf16, graphed rounds)"
    timeout "${TABLE_SECONDS:-360}" python3 -m specbench.cli run --device cuda --dtype bfloat16 --data-dir /root/data \
      --out $R/run --no-progress experiments/round_table.py ${TABLE_ARGS:-} 2>&1 | tail -4
    python3 -m specbench.cli table $R/run/results.jsonl --rows drafter,tree,budget --cols dataset \
      --value tau,decode_tok_s,speedup_decode | tee $R/table.md
    python3 -m specbench.cli table $R/run/results.jsonl --rows drafter,tree,budget --cols '' --spread none \
      --value draft_ms,tree_ms,verify_forward_ms,verify_ms,commit_ms,round_ms,overhead_frac | tee $R/stages.md
    since "AR: native vs transformers generate (bf16, every prompt warmed up)"
    timeout "${SPINE_SECONDS:-150}" python3 scripts/bench_spine.py --device cuda --dtype bfloat16 --data-dir /root/data \
      --prompts 3 --new-tokens 96 --gsm8k 3 --budgets 8 --json-out $R/bench_spine.json 2>&1 | grep -v -i warn | tail -24
    since "where eagle3's drafting goes: kernels of one request (profile_round --kernels)"
    timeout "${PROFILE_SECONDS:-90}" python3 scripts/profile_round.py --device cuda --dtype bfloat16 --prompts 1 \
      --max-new-tokens 96 --top 14 --configs eagle3/eagle2/64 --kernels > $R/profile_eagle3.txt 2>&1
    grep -E "^== |Self CUDA time total" $R/profile_eagle3.txt
    tar -czf "$OUT/round2.tgz" -C /root/results round2
    since done ;;
  foresight)  # issue 16: jetspec++ foresight on CUDA (second stream == inline == AR), then Table 3's columns
    R=/root/results/foresight; mkdir -p $R
    HEAD=${FS_HEAD:-/root/heads/jetspec++/int8}; STATES=${FS_STATES:-predicted}
    if [ ! -d "$HEAD" ]; then HEAD=specbench/heads/jetspec-smollm2-135m; STATES=${FS_STATES:-true}
      echo "no jetspec++ head at \$FS_HEAD: the plain jetspec head with states=$STATES"; fi
    since "GPU tests: foresight on a second stream == sequential == AR (fp32), host round and device round"
    [ "$STATES" = predicted ] && export SPECBENCH_JETSPECPP_HEAD="$HEAD"
    timeout "${TEST_SECONDS:-300}" python3 -m pytest -m gpu tests/gpu/test_foresight_cuda.py \
      tests/gpu/test_jetspecpp_foresight_device_cuda.py -p no:cacheprovider > $R/gpu_tests.txt 2>&1; tail -15 $R/gpu_tests.txt
    since "Table 3: AR, dflash, jetspec, jetspec++ critical path and pipelined (bf16, graphed verify)"
    timeout "${TABLE_SECONDS:-300}" python3 scripts/foresight_table.py --data /root/data --device cuda --dtype bfloat16 \
      --head "$HEAD" --states "$STATES" ${FS_CAL:+--calibration "$FS_CAL"} --n "${FS_N:-5}" --max-new-tokens 256 \
      --out $R/table.jsonl ${FS_ARGS:-} 2>&1 | grep -v "^foresight_table:" | tee $R/table.txt
    tar -czf "$OUT/foresight.tgz" -C /root/results foresight
    since done ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
