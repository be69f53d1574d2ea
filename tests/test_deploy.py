"""Deployment configs: every shipped one loads and runs at its geometry; bad fields are named."""

import pytest

from dsv41.backends import select
from dsv41.common.platform import Platform
from dsv41.common.geometry import Dims
from dsv41.config import ConfigError, load_deploy_config

PLATFORMS = {"gb200": Platform("cuda", "sm100", False), "h200": Platform("cuda", "sm90", False),
             "mi355": Platform("rocm", "gfx950", False)}


@pytest.mark.parametrize("name", ["gb200-tp4", "h200-tp4", "mi355-tp4", "mi355-tp2"])
def test_shipped_deployments_load_and_match_their_platform(name):
    d = load_deploy_config(name)
    assert Dims.of(d.model, d.tp).heads * d.tp == 64
    backend, _ = select(PLATFORMS[name.split("-")[0]], d.tp, d.max_tokens)
    assert backend == d.backend  # what auto-selection would pick there anyway
    assert d.record_format == ("fp8_mx" if name.startswith("gb200") else "fp8_ds_mla")


def test_a_bad_field_is_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: dsv41-flash\ntp: 4\nbackend: cutlass\nrecord_format: fp8_mx\nmax_tokens: 48\n")
    with pytest.raises(ConfigError, match="bad.yaml: backend: expected one of .* got 'cutlass'"):
        load_deploy_config(bad)
    with pytest.raises(ConfigError, match="deploy config 'b300-tp4': no file .* known names"):
        load_deploy_config("b300-tp4")


def test_parity_takes_the_deployment_backend_and_token_limit(capsys):
    """``dsv41 parity --deploy``: the deployment's backend against the reference, and no more
    tokens than its max_tokens."""
    from dsv41 import cli

    assert cli.main(["parity", "--deploy", "mi355-tp2", "--config", "tiny", "--tokens", "49"]) == 2
    err = capsys.readouterr().err
    assert "--tokens: expected at most the deployment's max_tokens 48, got 49" in err
