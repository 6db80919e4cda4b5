"""Generated package. Do not edit: run `python protos/generate.py`."""
