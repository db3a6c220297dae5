"""Measurement, apart from the product: the ``python -m engine bench`` command line (``cli``), the speed runners
and peers (``speed``, ``runners``, ``llama_bench``, ``mlx_speed``, ``mlx_peer``), batched, speculative and kernel
benches, the API server's load test (``server_load``), this machine's read bandwidth, and the writer of real-size
random-weight bench models (``model_shapes``, ``model_writer``). Importing the package loads nothing else; the
product never imports it."""
