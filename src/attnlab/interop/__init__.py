"""Interoperability: Hugging Face model directories (config.json + safetensors) in and out, and GGUF
files (llama.cpp) in. Needs the [hf] extra (transformers, tokenizers, gguf) only for parity tests;
loading uses safetensors, numpy and gguf."""
