"""Measurement, apart from the product: benchmarks and their peers (here only ``server_load``, the API server's
load test against llama.cpp's ``llama-server``). Importing the package loads nothing else; the product never
imports it."""
