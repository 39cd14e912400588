"""A vLLM general plugin: vLLM loads it in every process of its own (the engine core and each
model rank), before any model code runs. It asks Linux for the AMX tile registers where the CPU
has them.

vLLM's CPU attention takes its AMX kernel for bfloat16 on CPUs with AMX (Intel Sapphire Rapids
and later; `dtype auto` picks bfloat16 there), but Linux grants a process the AMX state only
once it asks (arch_prctl ARCH_REQ_XCOMP_PERM): a rank whose first AMX instruction comes from
that kernel, before oneDNN or anyone else asked, dies with SIGILL. PyTorch's ``_init_amx`` asks.
"""

from __future__ import annotations


def init_amx() -> None:
    import torch

    if torch.cpu._is_amx_tile_supported():  # noqa: SLF001 - PyTorch's own check and request
        torch.cpu._init_amx()  # noqa: SLF001
