"""Philox4x32-10, the counter-based generator of ``per_sample_philox``, in pure PyTorch (int64 arithmetic).

Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC 2011); the same rounds as
Random123's ``philox4x32_10`` and cuRAND's Philox4_32_10, and the same outputs on their known-answer vectors
(``tests/cuda_ext/test_philox_reference.py``). A counter-based generator needs no state besides a key and a
counter, so a kernel can draw its own numbers (thread ``i`` evaluates counter ``i``) and still give exactly
what this reference gives for the same ``(seed, counter)``.

Every 32-bit word is held in an int64 tensor (values ``0 .. 2^32 - 1``); a 32 x 32-bit product is formed
from two 32 x 16-bit products so that nothing exceeds 2^63.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
#: Round multipliers and Weyl key increments (Random123's PHILOX_M4x32_* and PHILOX_W32_*).
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10


def _mulhilo32(a: torch.Tensor, multiplier: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of ``a * multiplier`` (``a`` holds 32-bit words, ``multiplier < 2^32``).

    :param a: int64 tensor of values in ``[0, 2^32)``.
    :param multiplier: the 32-bit constant.
    :return: ``(hi, lo)``, int64 tensors of 32-bit words.
    """
    low_part = a * (multiplier & 0xFFFF)  # < 2^48
    high_part = a * (multiplier >> 16)  # < 2^48; the product is high_part * 2^16 + low_part
    partial = low_part + ((high_part & 0xFFFF) << 16)  # < 2^49
    return (high_part >> 16) + (partial >> 32), partial & _MASK32


def philox4x32_10(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Philox4x32 with 10 rounds.

    :param counter: ``[..., 4]`` int64, 32-bit words ``c0 .. c3``.
    :param key: ``[..., 2]`` int64 (broadcast against ``counter``), 32-bit words ``k0, k1``.
    :return: ``[..., 4]`` int64, the four 32-bit output words.
    """
    if counter.dtype != torch.int64 or counter.shape[-1:] != (4,):
        raise ValueError(f"counter must be [..., 4] int64, got {tuple(counter.shape)} {counter.dtype}")
    if key.dtype != torch.int64 or key.shape[-1:] != (2,):
        raise ValueError(f"key must be [..., 2] int64, got {tuple(key.shape)} {key.dtype}")
    c0, c1, c2, c3 = (counter[..., j] & _MASK32 for j in range(4))
    k0, k1 = key[..., 0] & _MASK32, key[..., 1] & _MASK32
    for round_index in range(PHILOX_ROUNDS):
        if round_index > 0:  # the key is bumped between rounds
            k0 = (k0 + PHILOX_W0) & _MASK32
            k1 = (k1 + PHILOX_W1) & _MASK32
        hi0, lo0 = _mulhilo32(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo32(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack([c0, c1, c2, c3], dim=-1)


def split_words(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The low and high 32-bit words of int64 values (two's complement, as a uint64 cast gives them).

    :param value: int64 tensor.
    :return: ``(low, high)``, int64 tensors of 32-bit words.
    """
    return value & _MASK32, (value >> 32) & _MASK32


def philox_uniforms(rng_state: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` uniform float64 draws in ``[0, 1)`` for the generator state ``rng_state = (seed, counter)``.

    Draw ``i`` is Philox4x32-10 of counter words ``(lo(i), hi(i), lo(counter), hi(counter))`` under key
    ``(lo(seed), hi(seed))``; its first two output words make 53 random bits,
    ``u_i = ((x0 >> 5) * 2^26 + (x1 >> 6)) * 2^-53`` (exact in float64). ``rng_state`` is not changed here.

    :param rng_state: ``[2] int64`` ``(seed, counter)``.
    :param n: number of draws, ``>= 0``.
    :return: ``[n] float64`` on ``rng_state``'s device.
    """
    index = torch.arange(n, dtype=torch.int64, device=rng_state.device)
    index_lo, index_hi = split_words(index)
    counter_lo, counter_hi = split_words(rng_state[1])
    seed_lo, seed_hi = split_words(rng_state[0])
    counter = torch.stack(
        [index_lo, index_hi, counter_lo.expand(n), counter_hi.expand(n)], dim=-1
    )
    words = philox4x32_10(counter, torch.stack([seed_lo, seed_hi]))
    high_bits = (words[:, 0] >> 5).double()  # 27 bits
    low_bits = (words[:, 1] >> 6).double()  # 26 bits
    return (high_bits * 67108864.0 + low_bits) * (1.0 / 9007199254740992.0)
