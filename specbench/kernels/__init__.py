"""Triton kernels for the GPU path, and pure-PyTorch references of the same ops.

  tree_attention.py   tree_attention (target verify), context_attention (draft heads), plan_attention
  tree_accept.py      greedy acceptance on the GPU (one host read per round)
  kv_compact.py       move the accepted path's K/V to the prefix, all layers in one launch
  masks.py            packed bitmasks (pack_tree_mask, block_causal_mask)
  device.py           where the kernels may run (CUDA, or the CPU under TRITON_INTERPRET=1)
  reference.py        the references the tests compare against

Nothing here imports the rest of specbench. Importing a kernel module imports Triton; masks.py and
reference.py do not. On the CPU the kernels run only under TRITON_INTERPRET=1 (set before import).
"""
