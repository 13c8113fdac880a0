"""Test isolation: a script's main() may set torch's default dtype (the sims work in float64); no test
may see what an earlier one left behind."""

import os

# the test process allocates like the entry points it tests (atr_llm.runtime): before torch's first large tensor
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import Phase, settings

# `make mutation` (mutmut): a first failing example kills a mutant; shrinking it would only cost time
settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate], database=None)


@pytest.fixture(autouse=True)
def _restore_torch_default_dtype():
    dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(dtype)
