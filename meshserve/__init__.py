"""meshserve: a gRPC serving mesh for LLMs, installed as one package.

Its parts are ``meshserve.services`` (the shared runtime), ``meshserve.gateway``, ``meshserve.router``,
``meshserve.cache_service``, ``meshserve.worker``, ``meshserve.trace_service``, ``meshserve.deploy``,
``meshserve.loadgen`` (the load generator) and ``meshserve.commands`` (the command line). In a
source tree they are the folders beside this one, at the repository's root; installed, they are
this package's subpackages (pyproject.toml maps them), so nothing else lands at the top level.
"""

from __future__ import annotations

import os

_here = os.path.dirname(os.path.abspath(__file__))
if not os.path.isdir(os.path.join(_here, "services")):  # a source tree: the parts are beside this folder
    __path__.append(os.path.dirname(_here))
