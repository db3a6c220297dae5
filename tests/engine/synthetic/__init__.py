"""Small random-weight GGUF models of every supported architecture, written as llama.cpp's loader expects them,
and quantized with llama.cpp's own quantizer: the inputs of the llama.cpp parity harness."""
