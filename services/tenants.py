"""The API keys file: which tenant each bearer key belongs to, and each tenant's settings.

One key a line, ``KEY TENANT`` and then the tenant's settings as ``name=value`` (``#`` starts a
comment)::

    sk-team-a-7c0a9d... team-a weight=2 priority=0 max_concurrency=64 tpm=200000
    sk-batch-41e2f8...  batch  weight=1 priority=5 daily_tokens=50000000 max_n=4 max_tokens=4096
    sk-ops-93b1c0...    ops    admin=1

Envoy reads the keys (authentication, the tenant header); the gateways read the settings (their
queue's order and share, and the limits). A tenant's settings may stand on any of its lines, and
must not differ between two of them. A bad line stops the service at start, naming the line.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path

TENANT_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
MIN_KEY_CHARACTERS = 8
API_KEYS_ENV = "MESHSERVE_API_KEYS"  # KEY=TENANT,KEY=TENANT (no settings), beside the file


class KeysError(ValueError):
    """The keys file or variable is malformed (the message names the line, never a key)."""


@dataclass(frozen=True)
class TenantSettings:
    """What one tenant gets when the fleet is saturated, and may use (0: no limit)."""

    weight: float = 1.0          # its share of the fleet when tenants queue, against the others' weights
    priority: int = 0            # its requests' default priority (vLLM's: lower is served first), and the
    #                              most urgent one it may ask for
    max_concurrency: int = 0     # its requests (each of n's choices counts) in flight at once
    tpm: int = 0                 # tokens a minute: prompt + max_tokens reserved at admission, settled
    daily_tokens: int = 0        # tokens a day (UTC), counted as tpm is
    max_n: int = 0               # most choices per request
    max_tokens: int = 0          # most tokens one choice may ask for
    admin: int = 0               # 1: may load and unload the fleet's LoRA adapters at run time


DEFAULT = TenantSettings()
_FIELDS = {f.name: f.type for f in dataclasses.fields(TenantSettings)}


@dataclass(frozen=True)
class Keys:
    tenants: dict[str, str]                  # key -> tenant
    settings: dict[str, TenantSettings]      # tenant -> its settings (tenants with a line of them)

    def of(self, tenant: str) -> TenantSettings:
        return self.settings.get(tenant, DEFAULT)


def _setting(name: str, value: str, where: str) -> tuple[str, float | int]:
    if name not in _FIELDS:
        raise KeysError(f"{where}: unknown setting {name!r} (known: {', '.join(_FIELDS)})")
    try:
        number: float | int = float(value) if name == "weight" else int(value)
    except ValueError:
        raise KeysError(f"{where}: {name} must be {'a number' if name == 'weight' else 'an integer'}, "
                        f"got {value!r}") from None
    if name == "weight" and not number > 0:
        raise KeysError(f"{where}: weight must be above 0, got {value}")
    if name == "admin" and number not in (0, 1):
        raise KeysError(f"{where}: admin must be 0 or 1, got {value}")
    if name not in ("weight", "priority") and number < 0:
        raise KeysError(f"{where}: {name} must be at least 0, got {value}")
    return name, number


def parse_keys(text: str, source: str) -> Keys:
    """``text`` in the keys file's format; KeysError naming the line of the first mistake."""
    tenants: dict[str, str] = {}
    settings: dict[str, tuple[TenantSettings, int]] = {}  # tenant -> (settings, the line they were on)
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source} line {n}"
        parts = line.split()
        if len(parts) < 2 or not TENANT_RE.fullmatch(parts[1]):
            raise KeysError(f"{where}: expected 'KEY TENANT [name=value ...]' (tenant: letters, digits, _.:-)")
        key, tenant, rest = parts[0], parts[1], parts[2:]
        if len(key) < MIN_KEY_CHARACTERS:
            raise KeysError(f"{where}: key shorter than {MIN_KEY_CHARACTERS} characters")
        if key in tenants:
            raise KeysError(f"{where}: duplicate key")
        tenants[key] = tenant
        if not rest:
            continue
        values = {}
        for item in rest:
            if "=" not in item:
                raise KeysError(f"{where}: expected name=value after the tenant, got {item!r}")
            name, number = _setting(*item.split("=", 1), where)
            values[name] = number
        these = dataclasses.replace(DEFAULT, **values)
        if tenant in settings and settings[tenant][0] != these:
            raise KeysError(f"{where}: settings of tenant {tenant!r} differ from those on line {settings[tenant][1]}")
        settings.setdefault(tenant, (these, n))
    return Keys(tenants, {tenant: s for tenant, (s, _) in settings.items()})


def load_keys(path: str, environ: dict[str, str] | os._Environ[str] = os.environ) -> Keys:
    """The keys of the file at ``path`` (none if empty) and of MESHSERVE_API_KEYS, read once."""
    keys = parse_keys(Path(path).read_text(), path) if path else Keys({}, {})
    if environ.get(API_KEYS_ENV):
        text = "\n".join(item.replace("=", " ", 1) for item in environ[API_KEYS_ENV].split(","))
        extra = parse_keys(text, API_KEYS_ENV)
        keys = Keys({**keys.tenants, **extra.tenants}, keys.settings)
    return keys
