"""Shared helpers of the kernel wrappers: argument checks and dtype-exact rounding inside kernels."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton import knobs

INT_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Rounding modes of _round_to (constexpr): which dtype an fp32 value is rounded to, kept in fp32.
ROUND_NONE, ROUND_BF16, ROUND_FP16 = 0, 1, 2
_ROUND_OF = {torch.float32: ROUND_NONE, torch.bfloat16: ROUND_BF16, torch.float16: ROUND_FP16}


# Read once: the kernels of this package are decorated (compiled or interpreted) right after this
# module is imported, and that choice is frozen at decoration time.
_INTERPRETED = bool(knobs.runtime.interpret)


def interpreted() -> bool:
    """True when this package was imported with TRITON_INTERPRET=1 (kernels run on CPU tensors)."""
    return _INTERPRETED


def round_mode(dtype: torch.dtype) -> int:
    return _ROUND_OF[dtype]


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def check_device(name: str, tensors: dict[str, torch.Tensor]) -> torch.device:
    """All tensors on one device, CUDA unless the interpreter is on; returns that device."""
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        where = ", ".join(f"{k}={t.device}" for k, t in tensors.items())
        raise ValueError(f"{name}: all tensors must be on one device, got {where}")
    device = devices.pop()
    if device.type == "cpu" and not interpreted():
        raise ValueError(f"{name}: CPU tensors need TRITON_INTERPRET=1 set before triton is imported")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: tensors must be on cuda (or cpu with TRITON_INTERPRET=1), got {device}")
    return device


def check_dtype(name: str, arg: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        names = "/".join(str(d).removeprefix("torch.") for d in allowed)
        raise ValueError(f"{name}: {arg} must be {names}, got {t.dtype}")


def check_shape(name: str, arg: str, t: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: {arg} must be {what} = {tuple(shape)}, got {tuple(t.shape)}")



def check_valid_len(name: str, valid_len: torch.Tensor | None, bs: int,
                    tensors: dict[str, torch.Tensor]) -> None:
    """Optional ragged block lengths [bs] (int); added to ``tensors`` for the device check."""
    if valid_len is not None:
        check_shape(name, "valid_len", valid_len, (bs,), "[bs]")
        check_dtype(name, "valid_len", valid_len, INT_DTYPES)
        tensors["valid_len"] = valid_len


def empty_accept_outputs(bs: int, block: int,
                         device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """accept_len [bs], bonus [bs], committed [bs, B], int64, for a kernel to fill."""
    return (torch.empty(bs, dtype=torch.int64, device=device),
            torch.empty(bs, dtype=torch.int64, device=device),
            torch.empty(bs, block, dtype=torch.int64, device=device))


@triton.jit
def round_to(x, MODE: tl.constexpr):
    """Round float32 x to bf16 / fp16 precision (round-to-nearest-even) and return it as float32.

    bf16 is done with integer ops because the Triton interpreter truncates in fp32 -> bf16 casts;
    the bit trick is exact for finite values on both the interpreter and the GPU.
    """
    if MODE == 1:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif MODE == 2:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x
