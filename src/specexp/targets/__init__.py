"""The target side: the Hugging Face loader and its sources (`hf`), the static-cache engine the evaluator runs
(`static`), and the CPU packing of its linear layers (`cpu_linear`)."""
