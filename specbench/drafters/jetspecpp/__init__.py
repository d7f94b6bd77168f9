"""JetSpec++ (methods.md §5): the self-refining draft model (part 1) and foresight drafting into a
speculation cache, pipelined with verification (part 2; docs/jetspecpp.md).

  model.py        checkpoint layout: draft head + state adapter, loading (also plain jetspec heads)
  adapter.py      the state adapter: per tapped layer, predicted block states from the verified prefix
  decoder.py      the training-free decoder: the target's layers above the top tap, norm, LM head
  device_states.py the refresh's state caches in the device round (written from the Acceptance)
  tap_stack.py    the adapter's taps of one layer count as one batched pass (stacked weights, one cache)
  outcomes.py     the outcome distribution P̂(k, a) of a drafted block
  drafter.py      the `jetspec++` drafter: J0 + Jacobi passes J1..JJ, context refresh, anchor replacement;
                  with foresight, blocks served from the speculation cache
  selection.py    which outcomes to draft ahead for: top-B, threshold, SSD fan-out; decoder or draft rows
  calibration.py  per-depth temperature scaling of the decoder's rows, fitted on recorded rounds
  foresight.py    the next block for B outcomes in one batched pass per step (J0, refreshes, J passes)
  cache.py        the speculation cache, keyed by the verified outcome in tokens
  pipeline.py     the hand-off beside the verify forward (a second CUDA stream), the draft device
  speculation.py  one round of foresight: launch beside verification, settle on the verify result

Training: `specbench.train.jetspecpp_objective` (clean-prefix refinement blocks + the adapter's
regression); held-out adapter / decoder metrics: `specbench.train.jetspecpp_eval`; offline hit rates
of the selection rules: `specbench.bench.hit_rate` (scripts/foresight_hits.py).
"""
