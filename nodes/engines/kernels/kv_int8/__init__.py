"""The KV transfer's int8 codec in one pass per row: `encode` (range, float16 params, codes) and
`decode` (into float32 or bf16 caches), `vectors` their hand-built code for rows of 64 and 128;
payloads and values bit-identical to bus.kv.quant's numpy reference. nodes.engines.kv_quant
injects them into the bus's `Quantizer` seam; compiled torch serves without them."""
