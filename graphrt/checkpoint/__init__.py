"""Checkpoints on disk -> graphrt's decoder: one layer above the model, below the engine.

hf_files.py (the small-file reader: config.json, generation_config.json, bounded JSON),
files.py (a checkpoint's tensor files: names, shapes, reading, the values check; shared by every
loader), loader.py (HF directory -> fused weights; the entry point `load_checkpoint`),
fp8_loader.py (FP8 checkpoints, or a float one quantized while loading), int4_loader.py (int4
checkpoints: int4_config.py parses quantization_config, int4_gptq.py / int4_awq.py / int4_ct.py
read GPTQ / AWQ / compressed-tensors layouts, int4_packing.py their shared unpacking; or a float
checkpoint quantized while loading), kv_scales.py (FP8 KV scales), decoder.py (fused weights -> LlamaDecoder), tokenizer.py + chat_template.py (tokenizer.json
and the chat template without transformers), hub.py (Hugging Face repo ids -> local snapshots),
gguf_file.py + gguf_tensors.py + gguf_quants.py + gguf_tokenizer.py (llama.cpp GGUF files: metadata
-> config, tensors dequantized under HF names (gguf_quants.py: the block types in torch), the
tokenizer from the metadata; docs/gguf.md).
"""
