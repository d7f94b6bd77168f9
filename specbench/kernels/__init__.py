"""Triton kernels for the GPU path, and pure-PyTorch references of the same ops.

Contract: every kernel takes plain tensors (device buffers, packed masks, lengths) and returns
tensors; lengths and masks are read on the device, never synchronised to the host, so launches can be
captured in CUDA graphs, and results that the host needs come packed for one read. Each kernel has a
reference in `reference.py` with the same arguments, and a test comparing the two on the CPU under
TRITON_INTERPRET=1.

Imports: nothing from the rest of specbench (torch, triton and numpy only); models/ and verify/ call
in. Importing a kernel module imports Triton; masks.py and reference.py do not. On the CPU the
kernels run only under TRITON_INTERPRET=1 (set before import).

  tree_attention.py   tree_attention (the target's verify pass) over context_attention (the general form);
                      split prefixes merge in a kernel of their own or, given tickets, in the last split
  decode_attention.py tree attention at one node (the AR step): contiguous keys, many splits, one vector merge
  tree_accept.py      greedy acceptance on the GPU (one host read per round)
  kv_compact.py       move the accepted path's K/V to the prefix, all layers in one launch
  ranked_topk.py      the k best entries of wide rows by (value desc, id asc): chunk + merge passes
  top_b_tree.py       DDTree's top-B tree over ranked per-depth tables, one program per tree
  ngram_trie.py       prompt lookup's suffix match and padded trie in one program (its reference: the ngram
                      drafter's tensor ops, drafters/ngram.py, which the kernel test compares)
  fused.py            the decoder layer's element-wise ops (add+RMSNorm, q/k-norm+RoPE+K/V write, SiLU*up)
  norm_linear.py      add+RMSNorm / SiLU*up fused into the matrix product after them (decode, verify rows); a
                      decode step's wo on the same matrix-vector kernel
  qkv_rope_linear.py  wqkv with the head-wise epilogue (q/k-norm, RoPE, q out, K/V into the caches)
  row_stats.py        RowStats: a stream whose pending part is added already (no Triton import)
  norm_stats.py       RMSNorm's row statistics from the product that writes the stream (residual epilogue), for
                      consumers with the norm weight folded in: a layer without its RMSNorm kernels (timed slower)
  kl_loss.py          the heads' forward-KL distillation loss per row: one streaming pass forward, one backward
  per_shape.py        the faster of a fused kernel and its unfused composition, timed once per shape
  ancestor_mask.py    a tree's ancestor mask from its parents, one program per tree (reference: masks.ancestor_masks)
  pack_bits.py        a bool mask packed into those int32 words in one launch (reference: masks.pack_tree_mask)
  masks.py            packed bitmasks (pack_tree_mask, block_causal_mask) and ancestor masks by pointer doubling
  device.py           where the kernels may run (CUDA, or the CPU under TRITON_INTERPRET=1)
  reference.py        the references the tests compare against
"""
