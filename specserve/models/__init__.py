"""Models to serve: the catalog (`catalog`), pulling and converting catalog models
(`provision`), and loading a name, HF dir or GGUF file (`load`)."""
