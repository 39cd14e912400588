import os, sys
_v = os.environ.get("MESH_SWITCH_MS")
if _v:
    sys.setswitchinterval(float(_v) / 1000)
