"""The Triton kernels: fused row solvers, their JVP and α-ReLU (:mod:`.rows`, kernels in
:mod:`.row_kernels`) and FlashAttention-style sparse attention (:mod:`.flash_attention`,
kernels in :mod:`.attention_kernels`).  Triton is imported only when a kernel is first needed."""
