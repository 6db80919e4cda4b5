"""What training, export and serving share, and nothing else: torch-free and model-free.

- ``contract.model_config`` / ``contract.repository``: the model repository format (config.yaml,
  version folders, model names, manifest.json);
- ``contract.schema``: typed YAML with errors that name the field;
- ``contract.graphs``: graph and file names, tensor names of the KV cache, the opset;
- ``contract.tokenizer``: the subword tokenizer (training writes it, serving reads it);
- ``contract.text``: ``TextTokenizer``, what serving needs of any tokenizer (the subword one,
  Marian's SentencePiece pair, a tokenizers JSON), chosen by config.yaml's ``tokenizer.kind``;
- ``contract.normalize``: source-text normalisers, named steps stored with the model;
- ``contract.images``: image decoding and normalisation;
- ``contract.tensorrt``: the TensorRT flavour names export and serving share.

``models``, ``export`` and ``serving`` import this package; it imports none of them (and no torch),
which tests/contract/test_import_rules.py enforces.
"""
