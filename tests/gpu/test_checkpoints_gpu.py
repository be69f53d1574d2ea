"""A synthesized V4-Flash directory (config.json, 128 x 128 scale blocks, compressor and indexer
tensors) through parity on the GPU: every backend at tp 4 on a window-only, a compressed and
the MTP layer, at V4-Flash's real geometry."""

from __future__ import annotations

import pytest
import torch

from dsv41 import cli
from dsv41.common.checkpoint import synth_checkpoint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def v4_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("dsv4-flash")
    synth_checkpoint("dsv4-flash", 3, out, mtp=1, like="dsv4-flash", others=True, seed=2)
    return out


@pytest.mark.parametrize("layer", [0, 2, 43])  # window only, ratio 4, mtp.0
@pytest.mark.parametrize("tokens", [1, 16])
def test_parity_on_a_dsv4_flash_directory(v4_dir, capsys, layer, tokens):
    rc = cli.main(["parity", "--checkpoint", str(v4_dir), "--tp", "4", "--layer", str(layer),
                   "--tokens", str(tokens), "--backends", "nvidia,mono"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "mono vs nvidia" in text and "parity ok" in text
