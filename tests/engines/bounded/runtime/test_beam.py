"""The beam runtime's planned buffers: requests only fill them; a batch past the plan is
refused."""
from __future__ import annotations

import pytest

from engines.bounded.plan import BeamPlan
from engines.bounded.runtime.beam_batch import BeamJob

from ..beam_reference import runner
from ..tasks.test_beam import _prompt


def test_requests_only_fill_the_planned_buffers(tiny_dir):
    r = runner(tiny_dir, plan=BeamPlan(2, 64, 3, 40))
    bufs = r.buffers
    planned = [t.data_ptr() for t in (*bufs.prompt_kv, *bufs.suffix_kv[0], *bufs.suffix_kv[1], bufs.logp)]
    size = bufs.nbytes()
    for i in range(3):
        r.run([BeamJob(_prompt(i, 40), 64, 3), BeamJob(_prompt(i + 9, 3), 20, 3)])
    assert [t.data_ptr() for t in (*bufs.prompt_kv, *bufs.suffix_kv[0], *bufs.suffix_kv[1], bufs.logp)] == planned
    assert bufs.nbytes() == size
    with pytest.raises(ValueError, match="planned buffers"):
        r.run([BeamJob(_prompt(0, 41), 8, 3)])
    with pytest.raises(ValueError, match="planned buffers"):
        r.run([BeamJob([1], 65, 3)])
    with pytest.raises(ValueError, match="1..2 jobs"):
        r.run([BeamJob([1], 8, 3)] * 3)
