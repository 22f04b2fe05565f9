"""This CPU's cache sizes, as the operating system reports them (Linux's sysfs, else ``sysconf``)."""

from __future__ import annotations

import os
from pathlib import Path

_SYSFS_CPU_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


def last_level_cache_bytes() -> int:
    """The size of this CPU's last-level cache in bytes (0 when the system does not say)."""
    sizes: dict[int, int] = {}
    for index in sorted(_SYSFS_CPU_CACHE.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = _parse_size((index / "size").read_text().strip())
        except (OSError, ValueError):
            continue
        if kind in ("Unified", "Data"):
            sizes[level] = max(sizes.get(level, 0), size)
    if sizes:
        return sizes[max(sizes)]
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            size = os.sysconf(name)
        except (ValueError, OSError):
            continue
        if size > 0:
            return int(size)
    return 0


def _parse_size(text: str) -> int:
    """``"32768K"`` / ``"32M"`` / ``"1024"`` -> bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)
