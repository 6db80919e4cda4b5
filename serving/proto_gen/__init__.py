"""Generated gRPC code for the protos under protos/.

Do not edit: run `python protos/generate.py`.
"""
