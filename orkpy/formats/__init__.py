"""Files and formats: GGUF read/write, safetensors, the architecture table (what each architecture's
files name and hold) and model sources, the tier map and emit-map, model directories.
"""
