"""Generated package, loaded into its own descriptor pool.

Do not edit: run `python protos/generate.py`.

Protobuf refuses two definitions of one message name in a pool, and tritonclient / KServe
register the same ``inference.*`` names in the default pool; this private pool keeps both
usable in one process.
"""

from google.protobuf import descriptor_pool as _descriptor_pool

POOL = _descriptor_pool.DescriptorPool()
