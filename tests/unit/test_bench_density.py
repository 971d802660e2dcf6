"""`bench density`'s goals, from figures made up here: what each sandbox is
charged for the template it shares."""

from __future__ import annotations

from typing import Any

from paracell.bench import density


def _results(shared_pss: float, mapped: float) -> dict[str, Any]:
    def runtime(pss: float) -> dict[str, Any]:
        return {"cpu_pct_per_sandbox": {"median_pct": 0.1},
                "pss_mib_per_sandbox": {"median_mib": pss}}

    templated = runtime(shared_pss)
    templated["pss_breakdown_mib"] = {"guest_ram_template_share": mapped}
    for key in ("growth_mib_per_writer", "own_ram_growth_mib_per_writer",
                "first_command_growth_mib", "first_command_own_ram_growth_mib"):
        templated[key] = {"median_mib": float(density.WRITE_MIB)}
    return {"paracell": runtime(100.0), density.COPIED: runtime(90.0),
            density.TEMPLATED: templated}


def test_the_template_is_charged_once_not_again_for_the_pages_each_sandbox_maps():
    # 10 sandboxes of 37 MiB PSS each, 1.5 MiB of it their share of the 30 MiB
    # template's pages they map: 37 - 1.5 + 30 / 10 = 38.5 MiB each, not 40.
    _, (text, met), _ = density.goals(_results(37.0, 1.5), 30.0, 10)
    assert "38.5 MiB" in text and met
    _, (text, met), _ = density.goals(_results(38.0, 0.5), 30.0, 10)
    assert "40.5 MiB" in text and not met


def test_a_sandbox_mapping_none_of_the_template_pays_its_whole_share():
    _, (text, _), _ = density.goals(_results(36.0, 0.0), 25.0, 10)
    assert "38.5 MiB" in text
