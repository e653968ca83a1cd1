"""Unit conversions, in one place. Inside stepsim everything is SI: bytes, seconds, FLOP, bytes/s.

Vendors quote NVLink and HBM in decimal GB/s (1e9 bytes/s), InfiniBand and Ethernet in Gb/s
(1e9 bits/s, divide by 8 for bytes), memory capacity in GiB (2**30 bytes). Config names carry
their unit (``nvlink_bandwidth_GBps``, ``network_bandwidth_Gbps``, ``latency_us``) and are
converted here, once.
"""

import re

from simulator.common import limits
from simulator.common.errors import ConfigError

GB = 1e9
GiB = 2**30
MiB = 2**20
KiB = 2**10
TERA = 1e12


def GBps(x: float) -> float:
    """Decimal GB/s to bytes/s."""
    return float(x) * 1e9


def Gbps(x: float) -> float:
    """Decimal Gbit/s to bytes/s."""
    return float(x) * 1e9 / 8.0


def us(x: float) -> float:
    """Microseconds to seconds."""
    return float(x) * 1e-6


def to_GBps(bytes_per_s: float) -> float:
    return bytes_per_s / 1e9


def to_GiB(n_bytes: float) -> float:
    return n_bytes / GiB


_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str, field: str = "size") -> int:
    """'16MiB' -> 16777216, '1GB' -> 1e9, '4096' -> 4096. Binary suffixes (KiB, MiB, GiB) are 2**10k."""
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise ConfigError(field, text, "expected a byte count such as 4096, 1MiB, 16MiB, 1GiB or 2GB")
    n = float(m.group(1)) * _SIZE_UNITS[unit]
    if not n >= 1:
        raise ConfigError(field, text, "a size must be at least 1 byte")
    if n > limits.MESSAGE_BYTES.maximum:
        raise ConfigError(field, text, f"a size must be {limits.MESSAGE_BYTES.describe()}")
    return int(round(n))


def format_size(n_bytes: float) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n_bytes >= scale and n_bytes % scale == 0:
            return f"{int(n_bytes // scale)}{unit}"
    return f"{int(n_bytes)}B"


# A number printed in scientific notation below 1e-12: in a report of seconds, GiB or shares,
# the rounding residue of a difference of large sums (idle = step - compute - waits), not a value.
_FLOAT_NOISE = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?e-(?:1[2-9]|[2-9]\d|\d{3,})(?![\w.])")


def hide_float_noise(text: str) -> str:
    """``text`` with every number below 1e-12 written in scientific notation shown as 0, for human
    output built from machine text (JSON prose keeps its numbers as they were)."""
    return _FLOAT_NOISE.sub("0", text)
