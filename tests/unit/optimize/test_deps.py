"""Optional dependencies of `serval optimize`: a missing library names the extra to install."""

from __future__ import annotations

import pytest

from serval.optimize.deps import MissingDependency, require

pytestmark = pytest.mark.unit


def test_a_missing_library_names_the_extra() -> None:
    with pytest.raises(MissingDependency, match=r"pip install 'serval-server\[optimize\]'"):
        require("serval_no_such_module_xyz")
