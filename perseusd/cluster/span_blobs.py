"""A spanning job's large documents (a node's profile, the solution) as blobs: the bytes compressed (gzip),
as base64 text cut into chunks each small enough for one etcd value, under a `BlobRef` that names them and
carries the sha256 of the bytes; joined back and checked against it. Pure data, no I/O: the chunks' keys are
`span_board.chunk_key`.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
from collections.abc import Mapping

from perseusd.cluster.span_board import MAX_BLOB_CHUNKS, BlobRef, check_name

BLOB_CHUNK_BYTES = 512 * 1024
"""Chunk size of a blob's base64 text: etcd refuses requests over 1.5 MiB by default."""


def blob_chunks(name: str, data: bytes) -> tuple[BlobRef, list[str]]:
    """`data` as a blob: its reference and the chunk values (gzip, base64, `BLOB_CHUNK_BYTES` each)."""
    check_name("blob", name)
    text = base64.b64encode(gzip.compress(data, mtime=0)).decode("ascii")
    chunks = [text[i : i + BLOB_CHUNK_BYTES] for i in range(0, len(text), BLOB_CHUNK_BYTES)] or [""]
    if len(chunks) > MAX_BLOB_CHUNKS:
        raise ValueError(f"blob {name} is too large ({len(text)} bytes compressed)")
    return BlobRef(name, hashlib.sha256(data).hexdigest(), len(chunks)), chunks


def join_blob(ref: BlobRef, chunks: Mapping[int, bytes]) -> bytes:
    """The blob's bytes from its chunks; ValueError when one is missing or the digest does not match."""
    if sorted(chunks) != list(range(ref.chunks)):
        raise ValueError(f"blob {ref.name}: {len(chunks)} of {ref.chunks} chunks")
    text = b"".join(chunks[i] for i in range(ref.chunks))
    try:
        data = gzip.decompress(base64.b64decode(text, validate=True))
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"blob {ref.name} does not decode: {exc}") from None
    if hashlib.sha256(data).hexdigest() != ref.digest:
        raise ValueError(f"blob {ref.name}: digest mismatch")
    return data
