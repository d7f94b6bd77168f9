"""JetSpec++ (methods.md §5), part 1: the self-refining draft model.

  model.py     checkpoint layout: draft head + state adapter, loading (also plain jetspec heads)
  adapter.py   the state adapter: per tapped layer, predicted block states from the verified prefix
  decoder.py   the training-free decoder: the target's layers above the top tap, norm, LM head
  outcomes.py  the outcome distribution P̂(k, a) of a drafted block
  drafter.py   the `jetspec++` drafter: J0 + Jacobi passes J1..JJ, context refresh, anchor replacement

Training: `specbench.train.jetspecpp_objective` (clean-prefix refinement blocks + the adapter's
regression); held-out adapter / decoder metrics: `specbench.train.jetspecpp_eval`.
"""
