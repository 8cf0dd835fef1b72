"""Export to serving engines (`engines`: vLLM, SGLang and Transformers layouts, their cards and round-trip
checks)."""
