"""The gateway's admission stage: a request is checked (naming the field at fault) and given an
id, then admitted while the gateway has a place for it, or refused at once with a retry hint."""

from __future__ import annotations

import grpc
import pytest

from meshserve.gateway.admission import Admission
from meshserve.gateway.errors import GatewayError
from meshserve.services import validation
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.tenants import TenantSettings


def refusal(admission: Admission, request: pb.GenerateRequest) -> GatewayError:
    with pytest.raises(GatewayError) as e:
        admission.checked(request)
    return e.value


def test_a_checked_request_is_a_copy_with_an_id_of_the_gateways_own() -> None:
    request = pb.GenerateRequest(prompt="hi", max_tokens=4)
    checked = Admission("m", 1).checked(request)
    assert checked.request_id and not request.request_id and checked.prompt == "hi"
    mine = pb.GenerateRequest(prompt="hi", request_id="r1")
    ids = {Admission("m", 1).checked(mine).request_id for _ in range(2)}
    assert len(ids) == 2 and "r1" not in ids and mine.request_id == "r1"  # the client's id keys nothing


@pytest.mark.parametrize(("request_fields", "code", "param"), [
    ({"prompt": "hi", "max_tokens": -1}, grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"),
    ({"prompt": "hi", "continue_token_ids": [1]}, grpc.StatusCode.INVALID_ARGUMENT, "continue_token_ids"),
    ({"prompt": "hi", "model": "other"}, grpc.StatusCode.NOT_FOUND, "model"),
])
def test_a_request_this_mesh_does_not_serve_is_refused_naming_the_field(
    request_fields: dict, code: grpc.StatusCode, param: str
) -> None:
    e = refusal(Admission("m", 1), pb.GenerateRequest(**request_fields))
    assert e.code == code and validation.param_of(e.trailers) == param


def test_past_the_bound_a_request_is_refused_at_once_with_a_retry_hint() -> None:
    admission = Admission("m", 2)
    with admission.admitted(), admission.admitted():
        with pytest.raises(GatewayError) as e:
            with admission.admitted():
                pass
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and ("retry-after", "1") in e.value.trailers
        assert admission.in_flight == 2
    assert admission.in_flight == 0
    with admission.admitted():  # a place freed is a place again
        assert admission.in_flight == 1


def test_a_tenant_gets_its_default_priority_and_may_not_ask_for_a_more_urgent_one() -> None:
    settings = {"batch": TenantSettings(priority=5, max_tokens=100)}
    admission = Admission("m", 1, lambda t: settings.get(t, TenantSettings()))
    assert admission.checked(pb.GenerateRequest(prompt="hi"), "batch").priority == 5
    assert admission.checked(pb.GenerateRequest(prompt="hi", priority=9), "batch").priority == 9  # later is fine
    assert admission.checked(pb.GenerateRequest(prompt="hi"), "other").priority == 0
    assert admission.checked(pb.GenerateRequest(prompt="hi"), "batch").max_tokens == 100  # the default, capped
    for request, param in [(pb.GenerateRequest(prompt="hi", priority=4), "priority"),
                           (pb.GenerateRequest(prompt="hi", max_tokens=101), "max_tokens")]:
        with pytest.raises(GatewayError) as e:
            admission.checked(request, "batch")
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and validation.param_of(e.value.trailers) == param


def test_a_lora_adapter_the_fleet_serves_is_admitted_and_the_base_models_name_cleared() -> None:
    adapters = {"support": "/a/support"}
    admission = Admission("m", 1, adapters=lambda: adapters)
    assert admission.checked(pb.GenerateRequest(prompt="hi", model="support")).model == "support"
    assert admission.checked(pb.GenerateRequest(prompt="hi", model="m")).model == ""  # every worker serves it
    e = refusal(admission, pb.GenerateRequest(prompt="hi", model="legal"))
    assert e.code == grpc.StatusCode.NOT_FOUND and validation.param_of(e.trailers) == "model"
    assert e.message == "the model 'legal' does not exist; this mesh serves 'm' and the LoRA adapters 'support'"
    adapters["legal"] = "/a/legal"  # the fleet's view is read at each request
    assert admission.checked(pb.GenerateRequest(prompt="hi", model="legal")).model == "legal"


def test_an_adapter_only_the_registry_has_goes_with_its_folder_and_clients_may_not_give_one() -> None:
    registry = {"faq": "/registry/faq"}
    admission = Admission("m", 1, adapters=lambda: {"support": "/a/support"}, registry=registry.get)
    on_demand = admission.checked(pb.GenerateRequest(prompt="hi", model="faq"))
    assert (on_demand.model, on_demand.lora_path) == ("faq", "/registry/faq")
    assert admission.checked(pb.GenerateRequest(prompt="hi", model="support")).lora_path == ""  # a worker holds it
    assert refusal(admission, pb.GenerateRequest(prompt="hi", model="legal")).code == grpc.StatusCode.NOT_FOUND
    e = refusal(admission, pb.GenerateRequest(prompt="hi", model="support", lora_path="/etc"))
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT and validation.param_of(e.trailers) == "lora_path"
