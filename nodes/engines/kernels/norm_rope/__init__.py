"""The elementwise steps of a bf16 pass of any size: RMSNorm, and RoPE with the span's K and V
written into its cache (`bf16`; `rows` is their hand-built vector code), bit-identical to
llama_ops.rms_norm and llama_ops.apply_rope, which serve without them."""
