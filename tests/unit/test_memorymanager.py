"""Choosing a container's memory manager: precedence, bounds, and clear refusals."""

from __future__ import annotations

import pytest

from paracell.errors import ParacellError
from paracell.runtime.vm import memorymanager
from paracell.runtime.vm.memorymanager import ANNOTATION, DEFAULT_KNOBS, choose


def test_the_pager_is_the_default_where_it_can_serve_the_guest() -> None:
    plan = choose(None, None, {}, 256)
    assert plan.manager == "pager" and plan.kernel_knobs == DEFAULT_KNOBS
    assert choose(None, None, {}, 2048).manager == "balloon"


def test_annotation_beats_flag_beats_config() -> None:
    assert choose("none", "balloon", {ANNOTATION: "pager"}, 256).manager == "pager"
    assert choose("none", "balloon", {}, 256).manager == "none"
    assert choose(None, "balloon", {}, 256).manager == "balloon"


@pytest.mark.parametrize("name", ["Pager", "virtio", "", " none"])
def test_unknown_managers_are_refused(name: str) -> None:
    if name == "":
        assert choose(None, None, {ANNOTATION: name}, 256).manager == "pager"
        return
    with pytest.raises(ParacellError, match="unknown memory manager"):
        choose(None, None, {ANNOTATION: name}, 256)


def test_an_explicit_pager_for_a_guest_it_cannot_serve_is_refused() -> None:
    with pytest.raises(ParacellError, match="up to 1024 MiB, not 2048 MiB"):
        choose("pager", None, {}, 2048)


def test_knob_annotations_set_guest_parameters_within_bounds() -> None:
    plan = choose(None, None, {"io.paracell.pager.delay-ms": "0",
                               "io.paracell.pager.order": "9"}, 256)
    assert plan.kernel_knobs["page_reporting.delay_ms"] == 0
    assert plan.kernel_knobs["paracell_pager.order"] == 9


@pytest.mark.parametrize("key,value,match", [
    ("io.paracell.pager.order", "0", "outside 1..10"),
    ("io.paracell.pager.order", "11", "outside 1..10"),
    ("io.paracell.pager.delay-ms", "60001", "outside 0..60000"),
    ("io.paracell.pager.delay-ms", "-1", "not a whole number"),
    ("io.paracell.pager.delay-ms", "\u0663", "not a whole number"),
    ("io.paracell.pager.reserve-kb", "1e3", "not a whole number"),
    ("io.paracell.pager.testing", "yes", "not a whole number"),
    ("io.paracell.pager.delay-ms", "5 ", "not a whole number"),
])
def test_bad_knobs_are_refused_in_one_line(key: str, value: str, match: str) -> None:
    with pytest.raises(ParacellError, match=match) as err:
        choose(None, None, {key: value}, 256)
    assert "\n" not in str(err.value)


def test_pager_knobs_without_the_pager_are_refused() -> None:
    with pytest.raises(ParacellError, match="needs the pager memory manager, not none"):
        choose("none", None, {"io.paracell.pager.order": "2"}, 256)


def test_every_knob_names_a_parameter_of_the_guest_patches() -> None:
    from paracell.guest.artifacts import REPO_ROOT

    patches = "".join(p.read_text() for p in (REPO_ROOT / "guest" / "pager").glob("*.patch"))
    for param, _, _ in memorymanager.KNOB_ANNOTATIONS.values():
        module, name = param.split(".")
        assert f"module_param_named({name}," in patches or f"module_param({name}," in patches
