"""Triton's system shared memory extension: registered regions of POSIX shared memory objects
that requests read inputs from and write outputs to instead of carrying the bytes.

A client creates an object (``shm_open`` key such as ``/input0``; tritonclient's
``tritonclient.utils.shared_memory`` does it), registers a region of it under a name
(``SystemSharedMemoryRegister``), and names that region in an input's or a requested output's
parameters: ``shared_memory_region`` (string), ``shared_memory_byte_size`` (int64) and
optionally ``shared_memory_offset`` (int64, from the region's start).

The registry is one small JSON file per region in a folder. In a server of several frontend
processes the folder is shared, so a region registered through one frontend serves requests
that reach any other (a client's connections are spread over the frontends). Nothing is mapped
or cached between requests: each one opens the object, reads (``pread``) or writes
(``pwrite``) its bytes and closes it, so an unregistered or unlinked object holds no memory of
the server's.

It is off unless the server is started with it (``system_shared_memory``): a client that may
register regions can make the server read and write any shared memory object its user can open,
so it is for clients on the same host that are trusted as much as the server.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import stat
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from serving.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from serving.kserve.parameters import int_parameter, string_parameter
from serving.proto_gen.inference import grpc_service_pb2 as pb

SHM_ROOT = Path("/dev/shm")  # where Linux keeps shm_open objects
MAX_REGIONS = 1024
MAX_NAME_CHARS = 256
MAX_KEY_BYTES = 255  # NAME_MAX
REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
PARAMETERS = (REGION, BYTE_SIZE, OFFSET)
OFF = (
    "system shared memory is off on this server; start it with --system-shared-memory "
    "(clients on the same host only) or send the data in the message"
)


@dataclass(frozen=True)
class Region:
    """A registered region: ``byte_size`` bytes from ``offset`` of the object ``key``."""

    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True)
class Slice:
    """What one tensor names: ``byte_size`` bytes from ``offset`` of a region."""

    region: Region
    offset: int
    byte_size: int


def object_name(key: str) -> str:
    """The file name of ``key`` under /dev/shm (shm_open ignores leading slashes).

    Raises:
        InvalidArgument: an empty key, or one holding a '/' after the leading ones, a NUL, or
            more than 255 bytes; "." and "..".
    """
    name = key.lstrip("/")
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise InvalidArgument(
            f"shared memory key {key[:80]!r} is not an shm_open name: send '/NAME' with no "
            "other '/' (e.g. '/input0')"
        )
    if len(name.encode()) > MAX_KEY_BYTES:
        raise InvalidArgument(f"a shared memory key must be at most {MAX_KEY_BYTES} bytes")
    return name


class SharedMemoryRegions:
    """The regions registered on one server (see the module docstring).

    Args:
        folder: where the registry's files live (created if missing; shared by the frontend
            processes of one server).
        max_bytes: the most bytes one tensor may read from a region (the server's message
            limit: shared memory does not widen what a request may hold).
        root: where the objects' keys resolve (Linux: /dev/shm).
    """

    def __init__(self, folder: Path, max_bytes: int, root: Path = SHM_ROOT) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self.root = root
        folder.mkdir(parents=True, exist_ok=True)
        # a registration's file content (it holds a nonce: a name registered again reads
        # differently) -> the region, so that a lookup reads the file but parses it once
        self._parsed: dict[bytes, Region] = {}

    # --- the registry ---------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        """Region ``name``'s registration file (a string: requests look it up, no pathlib)."""
        return f"{self.folder}/{_file_name(name)}"

    def register(self, name: str, key: str, offset: int, byte_size: int) -> Region:
        """Register ``byte_size`` bytes from ``offset`` of object ``key`` as ``name``.

        Raises:
            InvalidArgument: an empty or long name, a bad key, a zero size, a region past the
                object's end, an object that is not a regular shared memory file or that the
                server may not read and write.
            NotFound: no object has that key.
            AlreadyExists: a region of that name is registered.
            ResourceExhausted: MAX_REGIONS regions are registered.
        """
        if not name or len(name) > MAX_NAME_CHARS:
            raise InvalidArgument(f"name the region (1 to {MAX_NAME_CHARS} characters)")
        if byte_size <= 0:
            raise InvalidArgument(f"region {name[:80]!r}: byte_size must be > 0")
        with self._open(key, os.O_RDWR) as fd:
            size = os.fstat(fd).st_size
        if offset + byte_size > size:
            raise InvalidArgument(
                f"region {name[:80]!r}: offset {offset} + byte_size {byte_size} runs past the end "
                f"of shared memory object {key[:80]!r} ({size} bytes); it must lie inside it"
            )
        if len(list(self.folder.glob("*.json"))) >= MAX_REGIONS:
            raise ResourceExhausted(
                f"{MAX_REGIONS} regions are registered, the limit; unregister some before "
                "adding more"
            )
        region = Region(name, key, offset, byte_size)
        self._publish(region)
        return region

    def _publish(self, region: Region) -> None:
        """Write the region's file whole, or fail if its name is taken (hard link: exclusive)."""
        self.folder.mkdir(parents=True, exist_ok=True)  # a /tmp cleaner may have removed it
        handle, temporary = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
        try:
            with os.fdopen(handle, "w") as out:
                json.dump({"region": asdict(region), "nonce": uuid.uuid4().hex}, out)
            os.link(temporary, self._path(region.name))
        except FileExistsError:
            raise AlreadyExists(
                f"a shared memory region named {region.name[:80]!r} is registered; unregister "
                "it first or pick another name"
            ) from None
        finally:
            os.unlink(temporary)

    def unregister(self, name: str) -> None:
        """Forget region ``name`` (a name not registered is no error); "" forgets all."""
        files = map(str, self.folder.glob("*.json")) if not name else [self._path(name)]
        for file in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(file)

    def status(self, name: str = "") -> list[Region]:
        """Region ``name``, or every region ("").

        Raises:
            NotFound: no region of that name.
        """
        if name:
            return [self.get(name)]
        regions = []
        for file in self.folder.glob("*.json"):
            with contextlib.suppress(FileNotFoundError):  # unregistered meanwhile
                regions.append(self._read(str(file)))
        return sorted(regions, key=lambda r: r.name)

    def get(self, name: str) -> Region:
        """The region registered as ``name``.

        Raises:
            NotFound: no region of that name.
        """
        try:
            return self._read(self._path(name))
        except FileNotFoundError:
            raise NotFound(
                f"no shared memory region named {name[:80]!r} is registered; send the name of a "
                "registered region (SystemSharedMemoryStatus lists them) or register it first"
            ) from None

    def _read(self, path: str) -> Region:
        """The region a registration file holds (a request reads it: no pathlib, one parse)."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 1 << 16)  # a name and a key: a few KB at most
        finally:
            os.close(fd)
        region = self._parsed.get(data)
        if region is None:
            if len(self._parsed) >= 2 * MAX_REGIONS:  # registrations come and go: stay bounded
                self._parsed.clear()
            region = self._parsed[data] = Region(**json.loads(data)["region"])
        return region

    # --- tensors in regions ---------------------------------------------------------------------
    def slice(self, parameters: Any, what: str) -> Slice:
        """The region slice a tensor's parameters name (``names_region`` is true), checked.

        Raises:
            InvalidArgument: a parameter missing or of the wrong type, a size or offset out of
                the region.
            NotFound: no region of that name.
        """
        if REGION not in parameters or BYTE_SIZE not in parameters:
            present = [key for key in PARAMETERS if key in parameters]
            raise InvalidArgument(
                f"{what} sets {', '.join(present)}; data in shared memory needs both "
                f"{REGION} (string) and {BYTE_SIZE} (int64), {OFFSET} (int64) optional"
            )
        name = string_parameter(REGION, parameters[REGION])
        byte_size = int_parameter(BYTE_SIZE, parameters[BYTE_SIZE])
        offset = int_parameter(OFFSET, parameters[OFFSET]) if OFFSET in parameters else 0
        region = self.get(name)
        if byte_size < 0 or offset < 0 or offset + byte_size > region.byte_size:
            raise InvalidArgument(
                f"{what}: {BYTE_SIZE} {byte_size} at {OFFSET} {offset} does not lie inside "
                f"shared memory region {name[:80]!r} ({region.byte_size} bytes); it must"
            )
        return Slice(region, offset, byte_size)

    def read(self, piece: Slice, what: str) -> bytes:
        """The bytes of a tensor in shared memory.

        Raises:
            InvalidArgument: more than ``max_bytes``, or an object shrunk since it was
                registered.
            NotFound: the object is gone (unlinked).
        """
        if piece.byte_size > self.max_bytes:
            raise InvalidArgument(
                f"{what} has {piece.byte_size} bytes in shared memory; the server takes at most "
                f"{self.max_bytes} per tensor (max_message_bytes)"
            )
        with self._open(piece.region.key, os.O_RDONLY) as fd:
            data = os.pread(fd, piece.byte_size, piece.region.offset + piece.offset)
        if len(data) != piece.byte_size:
            raise InvalidArgument(
                f"{what}: shared memory object {piece.region.key[:80]!r} ends before the "
                f"{piece.byte_size} bytes of region {piece.region.name[:80]!r}; it was shrunk "
                "after it was registered: unregister it and register it again"
            )
        return data

    def write(self, piece: Slice, data: bytes, what: str) -> None:
        """Write an output's bytes into its slice.

        Raises:
            InvalidArgument: the output is larger than the slice.
            NotFound: the object is gone (unlinked).
        """
        if len(data) > piece.byte_size:
            raise InvalidArgument(
                f"{what} is {len(data)} bytes; its {BYTE_SIZE} in region "
                f"{piece.region.name[:80]!r} is {piece.byte_size}: it must be at least {len(data)}"
            )
        with self._open(piece.region.key, os.O_RDWR) as fd:
            os.pwrite(fd, data, piece.region.offset + piece.offset)

    @contextlib.contextmanager
    def _open(self, key: str, flags: int) -> Iterator[int]:
        """A descriptor of object ``key``: a regular file directly under the root (no links)."""
        path = f"{self.root}/{object_name(key)}"
        try:
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise NotFound(
                f"no shared memory object {key[:80]!r} exists on the server's host; create it "
                "(shm_open) on this host before registering or using it (the extension only "
                "serves clients on the server's host)"
            ) from None
        except PermissionError:
            raise InvalidArgument(
                f"the server may not open shared memory object {key[:80]!r} for reading and "
                "writing; it must be readable and writable by the server's user"
            ) from None
        except OSError as err:  # a symbolic link (ELOOP) or anything else odd
            raise InvalidArgument(
                f"shared memory object {key[:80]!r} cannot be opened ({err.strerror}); it must "
                "be a regular shm_open object, not a link"
            ) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InvalidArgument(
                    f"{key[:80]!r} is not a shared memory object; send the key of one"
                )
            yield fd
        finally:
            os.close(fd)


@functools.lru_cache(maxsize=4 * MAX_REGIONS)
def _file_name(name: str) -> str:
    """A region's registration file: any name, a safe file name of fixed length."""
    return hashlib.sha256(name.encode()).hexdigest() + ".json"


def off() -> FailedPrecondition:
    """The answer to a shared memory RPC on a server that has the extension off."""
    return FailedPrecondition(OFF)


def names_region(parameters: Any) -> bool:
    """Whether a tensor's parameters put it in shared memory (any of the three is set)."""
    return any(key in parameters for key in PARAMETERS)


def tensor_slice(parameters: Any, regions: SharedMemoryRegions | None, what: str) -> Slice | None:
    """The slice a tensor's parameters name (None: they name none).

    Raises:
        InvalidArgument: they name one on a server with shared memory off, or a bad one.
        NotFound: no region of that name.
    """
    if not names_region(parameters):
        return None
    if regions is None:
        raise InvalidArgument(f"{what} names a shared memory region: {OFF}")
    return regions.slice(parameters, what)


def shared_inputs(
    request: pb.ModelInferRequest, regions: SharedMemoryRegions | None
) -> dict[int, bytes]:
    """The bytes of each input of ``request`` that lies in shared memory, by input index."""
    found: dict[int, bytes] = {}
    for index, tensor in enumerate(request.inputs):
        if names_region(tensor.parameters):  # most requests: none, and no message built
            what = f"input {tensor.name[:100]!r}"
            piece = tensor_slice(tensor.parameters, regions, what)
            assert piece is not None and regions is not None  # or tensor_slice raised
            found[index] = regions.read(piece, what)
    return found
