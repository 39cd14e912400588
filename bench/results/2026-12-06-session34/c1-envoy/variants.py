"""Writes Envoy configs beside the running mesh's (meshserve up's run dir): the same edge on other
ports, minus one part each. usage: variants.py ENVOY_YAML  (then: envoy -c v80NN.yaml --base-id NN)
  8081 as shipped, 8082 without tracing, 8083 without the access log,
  8085 bare: no Lua, no transcoder, no header mutation, no tracing, no access log; the chat path
       routed straight to the gateway's HTTP edge (/v1/chat/completions:sse)."""
import copy, sys
import yaml
base = yaml.safe_load(open(sys.argv[1]))
def variant(port, admin, change):
    c = copy.deepcopy(base)
    c["admin"]["address"]["socket_address"]["port_value"] = admin
    listener = c["static_resources"]["listeners"][0]
    listener["address"]["socket_address"]["port_value"] = port
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    change(hcm)
    yaml.safe_dump(c, open(f"v{port}.yaml", "w"))
def bare(hcm):
    hcm.pop("tracing"); hcm.pop("access_log")
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.router"]
    vh = hcm["route_config"]["virtual_hosts"][0]
    edge = next(r for r in vh["routes"] if r["match"].get("path") == "/v1/chat/completions:sse")
    direct = copy.deepcopy(edge)
    direct["match"] = {"path": "/v1/chat/completions"}
    direct["route"]["prefix_rewrite"] = "/v1/chat/completions:sse"
    vh["routes"].insert(0, direct)
variant(8081, 9911, lambda h: None)
variant(8082, 9912, lambda h: h.pop("tracing"))
variant(8083, 9913, lambda h: h.pop("access_log"))
variant(8085, 9915, bare)
