"""The only thing that crosses from student code to the grader: data, never objects.

Messages are length-prefixed JSON. Besides JSON's own types they carry tensors (dtype, shape
and raw bytes) and tuples; nothing is unpickled, nothing is imported on decode, so a message
from a hostile process can make the grader's comparison fail but cannot run code in it. A
message larger than MAX_BYTES is refused on both sides (a 50 MB exception message is cut, not
carried).
"""

from __future__ import annotations

import base64
import json
import os
import select
import struct
import time

MAX_BYTES = 256 << 20
REASON_CHARS = 2000


class WireError(Exception):
    """A message that is malformed, too large, or of a type the wire does not carry."""


def encode(obj):
    """A JSON-ready copy of `obj`: None, bool, int, float, str, list, tuple, dict with str keys,
    bytes and dense torch tensors (moved to the CPU)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        items = [encode(x) for x in obj]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise WireError("dict keys must be str")
        return {"__dict__": {k: encode(v) for k, v in obj.items()}}
    if isinstance(obj, bytes):
        return {"__bytes__": base64.b64encode(obj).decode()}
    if type(obj).__module__ == "torch" and type(obj).__name__ in ("Tensor", "Parameter"):
        return _encode_tensor(obj)
    if type(obj).__module__ == "torch" and type(obj).__name__ == "dtype":
        return {"__dtype__": str(obj).removeprefix("torch.")}
    raise WireError(f"can't send a {type(obj).__name__} (only numbers, strings, lists, dicts and tensors)")


def _encode_tensor(t):
    import torch

    t = t.detach().to("cpu").contiguous()
    raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"__tensor__": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "data": base64.b64encode(raw).decode()}


def decode(obj):
    """The inverse of `encode`; anything else is a WireError."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [decode(x) for x in obj]
    if not isinstance(obj, dict) or len(obj) == 0:
        raise WireError(f"unexpected {type(obj).__name__} on the wire")
    if "__tuple__" in obj:
        return tuple(decode(x) for x in _list(obj["__tuple__"]))
    if "__dict__" in obj:
        return {str(k): decode(v) for k, v in obj["__dict__"].items()}
    if "__bytes__" in obj:
        return base64.b64decode(obj["__bytes__"])
    if "__dtype__" in obj:
        return _dtype(obj["__dtype__"])
    if "__tensor__" in obj:
        return _decode_tensor(obj)
    raise WireError(f"unknown message field {sorted(obj)[0]!r}")


def _list(x):
    if not isinstance(x, list):
        raise WireError("malformed tuple")
    return x


def _dtype(name):
    import torch

    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise WireError(f"unknown dtype {name!r}")
    return dtype


def _decode_tensor(obj):
    import torch

    dtype, shape = _dtype(obj["__tensor__"]), obj["shape"]
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise WireError("malformed tensor shape")
    raw = bytearray(base64.b64decode(obj["data"]))
    numel = 1
    for s in shape:
        numel *= s
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if len(raw) != numel * itemsize:
        raise WireError(f"tensor of shape {shape} {dtype} needs {numel * itemsize} bytes, got {len(raw)}")
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape).clone()


# ---------------------------------------------------------------- framing over a file descriptor

def send(fd: int, obj) -> None:
    body = json.dumps(encode(obj)).encode()
    if len(body) > MAX_BYTES:
        raise WireError(f"message of {len(body)} bytes exceeds {MAX_BYTES}")
    _write_all(fd, struct.pack("<Q", len(body)) + body)


def recv(fd: int, deadline: float | None = None):
    """The next message; EOFError when the other side closed the pipe, TimeoutError when
    `deadline` (time.monotonic()) passes first."""
    (size,) = struct.unpack("<Q", _read_exact(fd, 8, deadline))
    if size > MAX_BYTES:
        raise WireError(f"message of {size} bytes exceeds {MAX_BYTES}")
    try:
        return decode(json.loads(_read_exact(fd, size, deadline)))
    except (ValueError, TypeError, KeyError) as exc:
        raise WireError(f"malformed message: {exc}") from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int, deadline: float | None = None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None and not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise TimeoutError("no message before the deadline")
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def short(text: str, limit: int = REASON_CHARS) -> str:
    """A reason cut to `limit` characters (a student's exception message can be any size)."""
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters cut]"
