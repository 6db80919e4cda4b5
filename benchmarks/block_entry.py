"""A benchmark entry with a decode block graph of K steps (``export --decode-block K``): written
next to the entry's in-place decoder once, the manifest saying so, so that every precision and
attention the engine benchmark exports can also run in blocks without a second export."""

from __future__ import annotations

from pathlib import Path


def with_decode_block(entry: Path, steps: int) -> None:
    """Give ``entry``'s latest version a ``decoder_block`` of ``steps`` steps (kept when it has
    one of that size and today's revision)."""
    from contract.graphs import DECODER_BLOCK_FILE
    from contract.repository import read_manifest, resolve_version, write_manifest
    from export.decoder_block import block_manifest, write_decode_block

    version = resolve_version(entry)
    manifest = read_manifest(version)
    inplace = manifest.get("decoders", {}).get("inplace")
    if inplace is None:
        raise ValueError(f"{entry} has no in-place decoder to run in blocks")
    if (
        inplace.get("decode_block") == block_manifest(steps)
        and (version / DECODER_BLOCK_FILE).is_file()
    ):
        return
    inplace["decode_block"] = write_decode_block(version, steps)
    if DECODER_BLOCK_FILE not in manifest["files"]:
        manifest["files"].append(DECODER_BLOCK_FILE)
    write_manifest(version, manifest)
