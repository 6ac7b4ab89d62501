"""Put first on a server's PYTHONPATH, this makes `import cupy` fail as on a machine without CuPy,
also where CuPy is installed (a GPU machine): the no-CuPy fallback is tested everywhere."""

raise ImportError("No module named 'cupy' (hidden by tests/gpu/no_cupy)")
